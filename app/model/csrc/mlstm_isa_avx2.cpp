// The avx2 level of the mLSTM step kernels (mlstm_kernels.h), a file of its own so the build
// compiles the levels in parallel.
#include "mlstm_kernels.h"

#if MLSTM_X86
namespace mlstm_k {
MLSTM_ISA(avx2, ISA_V3, 8, 4, 3, 6, 2)
MLSTM_ISA_INSTANTIATE(avx2)
}  // namespace mlstm_k
#endif
