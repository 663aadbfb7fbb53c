// The dispatch table's entries (type_kernels.h) of the types whose blocks hold a code per value and a scale per 32
// values: Q4_0 ... Q8_0, and IQ4_NL and IQ4_XS (their codes through a 16-entry table).
#include "type_kernels.h"

namespace gguf {

template const TypeKernels& type_kernels<Q4_0>();
template const TypeKernels& type_kernels<Q4_1>();
template const TypeKernels& type_kernels<Q5_0>();
template const TypeKernels& type_kernels<Q5_1>();
template const TypeKernels& type_kernels<Q8_0>();
template const TypeKernels& type_kernels<IQ4_NL>();
template const TypeKernels& type_kernels<IQ4_XS>();

}  // namespace gguf
