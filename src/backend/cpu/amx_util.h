// Helpers shared by the AMX kernel files (*_amx.cpp, compiled for AVX-512 and AMX only): the
// thread's tile configuration and the 16 × 16 word transpose that builds B operands.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec::cpu {

// GCC's tile intrinsics are asm statements that name only registers (and, for ldtilecfg, the
// first bytes of the configuration) as inputs: memory written just before one of them must be
// made visible to the compiler first.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// Loads the configuration every AMX kernel assumes, once per thread: all eight tiles 16 rows ×
// 64 bytes (kernels_amx.cpp).
void configure_tiles();

// The 16 × 16 matrix of 32-bit words r[0..15] (row i in r[i]) transposed in place: 64 shuffles.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4i + e], 128-bit lane l: column 4l + e of rows 4i .. 4i + 3.
  __m512i u[16];
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i p0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), p1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xee);
    const __m512i q0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i q1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xee);
    r[e] = _mm512_shuffle_i32x4(p0, q0, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(p0, q0, 0xdd);
    r[8 + e] = _mm512_shuffle_i32x4(p1, q1, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(p1, q1, 0xdd);
  }
}

}  // namespace specdec::cpu
