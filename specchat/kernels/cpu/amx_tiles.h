// AMX's tile registers (Intel Xeon since Sapphire Rapids), shared by the kernels that use them (bf16_tiles.h,
// gguf/amx.h): whether this process may use them, and their configuration on a thread around a pass. Linux lends
// a thread the tiles once the process asks (arch_prctl ARCH_REQ_XCOMP_PERM); every kernel here takes all eight
// as 16 rows of 64 bytes, so one configuration serves them all.

#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AVX512F__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TILES 1
#endif

namespace amx {

#ifdef AMX_TILES

// Whether this process may use the tile registers (asked of the kernel once).
inline bool ready() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

// The eight tile registers as 16 rows of 64 bytes on this thread, for as long as this lives.
class Tiles {
 public:
  Tiles() {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;  // palette 1; bytes 16-31: each tile's bytes a row, 48-55: its rows
    for (int t = 0; t < 8; ++t) config[16 + 2 * t] = 64, config[48 + t] = 16;
    // ldtilecfg by hand: GCC's _tile_loadconfig tells the compiler it reads 8 bytes, so the rest were not stored
    asm volatile("ldtilecfg %0" : : "m"(config));
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

#else

inline bool ready() { return false; }

#endif

}  // namespace amx
