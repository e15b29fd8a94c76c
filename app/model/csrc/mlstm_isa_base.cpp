// The base level of the mLSTM step kernels (mlstm_kernels.h), a file of its own so the build
// compiles the levels in parallel.
#include "mlstm_kernels.h"

namespace mlstm_k {
MLSTM_ISA(base, , 4, 4, 2, 6, 2)
MLSTM_ISA_INSTANTIATE(base)
}  // namespace mlstm_k
