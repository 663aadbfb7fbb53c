// `attention` over a bf16 cache, beside bf16 or fp32 activations (`attend_bf16`, `attend_bf16_tiles`).
#include "attention_kernels.h"

namespace cpu_decoder {

CPU_DECODER_ATTENTION(at::BFloat16, PlainKv<at::BFloat16>);
CPU_DECODER_ATTENTION(float, PlainKv<at::BFloat16>);

}  // namespace cpu_decoder
