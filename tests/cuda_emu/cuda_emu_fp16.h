// __half and __nv_bfloat16 for the CPU emulation: 16-bit storage types with CUDA's conversion intrinsics,
// rounding to nearest even like the hardware. Kernels do their arithmetic in float, so no operators here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __half {
  std::uint16_t bits;
};
struct __nv_bfloat16 {
  std::uint16_t bits;
};

namespace cuda_emu {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7e00u;             // NaN stays a (quiet) NaN
  if (mag >= 0x477ff000u) return sign | 0x7c00u;            // >= 65520 rounds to infinity
  if (mag < 0x38800000u) {                                   // below 2^-14: a half subnormal
    const float scaled = std::fabs(f) * 16777216.0f;         // in units of 2^-24, exact
    return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));  // default rounding: nearest even
  }
  const std::uint32_t exp = (mag >> 23) - 127 + 15;
  const std::uint32_t rest = mag & 0x1fffu;
  std::uint32_t h = (exp << 10) | ((mag >> 13) & 0x3ffu);
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is still right
  return sign | static_cast<std::uint16_t>(h);
}

inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

inline std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace cuda_emu

inline float __half2float(__half h) { return cuda_emu::half_bits_to_float(h.bits); }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline __half __float2half(float f) { return __half{cuda_emu::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return cuda_emu::bits_float(std::uint32_t(b.bits) << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{cuda_emu::float_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __int_as_float(int i) { return cuda_emu::bits_float(static_cast<std::uint32_t>(i)); }
inline int __float_as_int(float f) { return static_cast<int>(cuda_emu::float_bits(f)); }
inline float __uint_as_float(unsigned u) { return cuda_emu::bits_float(u); }
inline unsigned __float_as_uint(float f) { return cuda_emu::float_bits(f); }
