// The one float32 -> bfloat16 conversion of ops.cc and dnnl.cc: round to nearest, ties to even; a
// subnormal becomes a zero of its sign, as the hardware conversion (vcvtneps2bf16, which oneDNN's bf16
// kernels use) makes it, so a value is rounded alike on every route and no bf16 we write is subnormal
// (bf16 has float32's exponent range); a NaN stays a NaN (it keeps a mantissa bit that its low half
// alone could have set). Plain integer code: it runs on every CPU.
#pragma once

#include <cstdint>
#include <cstring>

namespace zoo_bf16 {

inline uint16_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace zoo_bf16
