// `attention` over a cache in the activations' own dtype, fp32 or fp16 (`attend`: fp32 arithmetic).
#include "attention_kernels.h"

namespace cpu_decoder {

CPU_DECODER_ATTENTION(float, PlainKv<float>);
CPU_DECODER_ATTENTION(at::Half, PlainKv<at::Half>);

}  // namespace cpu_decoder
