// `attention` over an int8 cache, beside activations of any dtype (`attend_int8`).
#include "attention_kernels.h"

namespace cpu_decoder {

CPU_DECODER_ATTENTION(float, Int8Kv);
CPU_DECODER_ATTENTION(at::BFloat16, Int8Kv);
CPU_DECODER_ATTENTION(at::Half, Int8Kv);

}  // namespace cpu_decoder
