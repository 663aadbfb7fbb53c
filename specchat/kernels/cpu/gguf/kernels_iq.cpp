// The dispatch table's entries (type_kernels.h) of the codebook types: IQ1_S ... IQ3_S.
#include "type_kernels.h"

namespace gguf {

template const TypeKernels& type_kernels<IQ1_S>();
template const TypeKernels& type_kernels<IQ1_M>();
template const TypeKernels& type_kernels<IQ2_XXS>();
template const TypeKernels& type_kernels<IQ2_XS>();
template const TypeKernels& type_kernels<IQ2_S>();
template const TypeKernels& type_kernels<IQ3_XXS>();
template const TypeKernels& type_kernels<IQ3_S>();

}  // namespace gguf
