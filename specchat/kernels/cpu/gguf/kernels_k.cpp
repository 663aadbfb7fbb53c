// The dispatch table's entries (type_kernels.h) of the K-quants: Q2_K ... Q6_K.
#include "type_kernels.h"

namespace gguf {

template const TypeKernels& type_kernels<Q2_K>();
template const TypeKernels& type_kernels<Q3_K>();
template const TypeKernels& type_kernels<Q4_K>();
template const TypeKernels& type_kernels<Q5_K>();
template const TypeKernels& type_kernels<Q6_K>();

}  // namespace gguf
