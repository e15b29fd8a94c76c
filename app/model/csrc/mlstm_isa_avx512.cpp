// The avx512 level of the mLSTM step kernels (mlstm_kernels.h), a file of its own so the build
// compiles the levels in parallel.
#include "mlstm_kernels.h"

// Register budgets: AVX-512 has 32 vector registers (tiles of 24 / 16 accumulators), AVX2 and SSE2 have
// 16 (12 / 8 accumulators). NV * lanes must be a multiple of 4 (gate-interleaved panels).
#if MLSTM_X86
namespace mlstm_k {
MLSTM_ISA(avx512, ISA_V4, 16, 6, 4, 8, 2)
MLSTM_ISA_INSTANTIATE(avx512)
}  // namespace mlstm_k
#endif
