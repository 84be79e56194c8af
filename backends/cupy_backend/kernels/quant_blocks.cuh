// Weights as a GGUF file stores them, dequantized exactly as the `gguf` package's NumPy code computes them
// (the reference: backends/model/quant.py's QuantMatrix.dequantize, gguf.quants.dequantize). Layouts in bytes:
//   Q4_0  (18 per 32 weights)  f16 d, 16 bytes of nibbles              d * (q - 8)
//   Q4_1  (20)                 f16 d, f16 m, nibbles                   d * q + m
//   Q8_0  (34)                 f16 d, 32 int8                          d * q
//   Q5_0  (22)                 f16 d, qh (4), nibbles                  d * (q - 16), q = nibble | fifth bit << 4
//   Q5_1  (24)                 f16 d, f16 m, qh (4), nibbles           d * q + m
//   Q4_K  (144 per super-block of 256: 8 sub-blocks of 32)  f16 d, f16 dmin, 12 bytes of 6-bit scales sc and
//         mins mn, qs (128)                                            (d * sc) * q - dmin * mn
//   Q5_K  (176)  d, dmin, scales, qh (32), qs (128)                    as Q4_K, q with its fifth bit
//   Q6_K  (210)  ql (128), qh (64), 16 int8 scales (one per 16 weights), f16 d     (d * scale) * (q - 32)
//   Q2_K  (84)   16 bytes of 4-bit scales sc (low nibble) and mins mn (high), one per 16 weights, qs (64),
//                f16 d, f16 dmin                                       (d * sc) * q - dmin * mn, q 2 bits
//   Q3_K  (110)  hmask (32), qs (64), 12 bytes of 6-bit scales, f16 d  (d * scale) * (q - 4), q 3 bits
// Nibble byte j of a 32-weight block holds weight j in its low half and weight j + 16 in its high half; bit j
// of Q5's qh is weight j's fifth bit. Sub-block s of a Q4_K / Q5_K super-block is the low (s even) or high
// nibbles of qs bytes 32 (s / 2) .. + 31, its fifth bits bit s of qh's 32 bytes. Q6_K's sub-block s lies in
// half s / 4 of the super-block: the low (s % 4 < 2) or high nibbles of ql bytes 64 (s / 4) + 32 (s % 2) .. + 31,
// and bits 2 (s % 4), 2 (s % 4) + 1 of qh bytes 128 + 32 (s / 4) .. + 31 above them. Q2_K's and Q3_K's
// sub-block s is bits 2 (s % 4), 2 (s % 4) + 1 of the 32 qs bytes of half s / 4 of the super-block; Q3_K's
// third bit is bit s of hmask's 32 bytes. Their scales are per 16 weights: half h of sub-block s has scale 2s + h.
//
// The operations are gguf's, each rounded to float on its own (__fmul_rn, __fadd_rn: NVCC never contracts them
// into an FMA; x - y is x + -y in IEEE, sign of zero included). A float16 scale has 11 significant bits, so its
// products with the integers (d * q, d * sc, dmin * mn, d * scale, (d * sc) * q) are exact in float; what rounds
// is Q4_1 / Q5_1's + m, Q4_K / Q5_K / Q2_K's - dmin * mn, and Q6_K's (d * scale) * (q - 32) (up to 25 bits;
// Q3_K's (d * scale) * (q - 4) has at most 20).
//
// The unit one thread dequantizes is half of a block of 32 weights (a K-quant super-block is 8 such blocks):
// 16 weights as two runs of 8 consecutive weights, which the GEMV multiplies with 16-byte vectors of
// activations. Every block length is even and every field starts at an even offset, so in a row of blocks all
// multi-byte reads are 2-byte loads.
#pragma once

#include "common.cuh"

namespace ps_quant {

constexpr int kBlock = 32;  // weights per block (a K-quant sub-block)
constexpr int kHalves = 2;  // halves per block
constexpr int kRun = 8;     // consecutive weights per run; two runs per half
constexpr int kSuper = 256;  // weights per K-quant super-block

// Half h of a block, dequantized: run r holds the block's weights start[r] .. start[r] + 7.
struct Half {
  float w[2][kRun];
  int start[2];
};

__device__ __forceinline__ unsigned load_u16(const unsigned char* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}

__device__ __forceinline__ float load_f16(const unsigned char* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(load_u16(p))));
}

__device__ __forceinline__ float to_f(int q) { return static_cast<float>(q); }

// 16 consecutive bytes, in 2-byte loads.
struct Bytes16 {
  unsigned two[8];
  __device__ __forceinline__ int operator[](int i) const { return static_cast<int>((two[i / 2] >> (8 * (i % 2))) & 0xffu); }
};

__device__ __forceinline__ Bytes16 load_bytes16(const unsigned char* p) {
  Bytes16 b;
#pragma unroll
  for (int i = 0; i < 8; ++i) b.two[i] = load_u16(p + 2 * i);
  return b;
}

// Weights 16h .. 16h + 15 of a block: value(i) is weight 16h + i.
template <typename Value>
__device__ __forceinline__ Half consecutive_half(int h, Value value) {
  Half out{{}, {16 * h, 16 * h + kRun}};
#pragma unroll
  for (int i = 0; i < 2 * kRun; ++i) out.w[i / kRun][i % kRun] = value(i);
  return out;
}

// Nibble bytes 8h .. 8h + 7 of a 32-weight block: low nibbles are weights 8h + i, high nibbles 16 + 8h + i;
// value(q, j) is weight j's value from its nibble q.
template <typename Value>
__device__ __forceinline__ Half nibble_half(const unsigned char* nibbles, int h, Value value) {
  Half out{{}, {8 * h, 16 + 8 * h}};
  const unsigned char* bytes = nibbles + 8 * h;
#pragma unroll
  for (int i = 0; i < kRun; i += 2) {
    const unsigned two = load_u16(bytes + i);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int byte = static_cast<int>((two >> (8 * j)) & 0xffu);
      out.w[0][i + j] = value(byte & 0xf, out.start[0] + i + j);
      out.w[1][i + j] = value(byte >> 4, out.start[1] + i + j);
    }
  }
  return out;
}

// Each type: kWeights per stored block (32, or a K-quant's 256) in kBytes, and half(block, sub, h): half h of
// its 32-weight sub-block `sub` (always 0 but for the K-quants).
struct Q4_0 {
  static constexpr int kWeights = kBlock, kBytes = 18;
  __device__ static __forceinline__ Half half(const unsigned char* block, int, int h) {
    const float d = load_f16(block);
    return nibble_half(block + 2, h, [d](int q, int) { return __fmul_rn(d, to_f(q - 8)); });
  }
};

struct Q4_1 {
  static constexpr int kWeights = kBlock, kBytes = 20;
  __device__ static __forceinline__ Half half(const unsigned char* block, int, int h) {
    const float d = load_f16(block), m = load_f16(block + 2);
    return nibble_half(block + 4, h, [d, m](int q, int) { return __fadd_rn(__fmul_rn(d, to_f(q)), m); });
  }
};

struct Q8_0 {
  static constexpr int kWeights = kBlock, kBytes = 34;
  // Bytes 16h .. 16h + 15: weights 16h + i, as signed 8-bit integers.
  __device__ static __forceinline__ Half half(const unsigned char* block, int, int h) {
    const float d = load_f16(block);
    const Bytes16 q = load_bytes16(block + 2 + 16 * h);
    return consecutive_half(h, [d, &q](int i) { return __fmul_rn(d, to_f(static_cast<signed char>(q[i]))); });
  }
};

// Q5's 32 fifth bits, little-endian as gguf reads them.
__device__ __forceinline__ unsigned load_qh(const unsigned char* p) { return load_u16(p) | load_u16(p + 2) << 16; }

struct Q5_0 {
  static constexpr int kWeights = kBlock, kBytes = 22;
  __device__ static __forceinline__ Half half(const unsigned char* block, int, int h) {
    const float d = load_f16(block);
    const unsigned qh = load_qh(block + 2);
    return nibble_half(block + 6, h, [d, qh](int q, int j) {
      return __fmul_rn(d, to_f((q | static_cast<int>((qh >> j) & 1u) << 4) - 16));
    });
  }
};

struct Q5_1 {
  static constexpr int kWeights = kBlock, kBytes = 24;
  __device__ static __forceinline__ Half half(const unsigned char* block, int, int h) {
    const float d = load_f16(block), m = load_f16(block + 2);
    const unsigned qh = load_qh(block + 4);
    return nibble_half(block + 8, h, [d, m, qh](int q, int j) {
      return __fadd_rn(__fmul_rn(d, to_f(q | static_cast<int>((qh >> j) & 1u) << 4)), m);
    });
  }
};

// Sub-block s's 6-bit scale and min from a Q4_K / Q5_K super-block's 12 packed bytes (gguf's get_scale_min):
// s < 4: the low 6 bits of bytes s and s + 4; else byte s + 4's low (scale) or high (min) nibble, with the top
// 2 bits of byte s - 4 (scale) or s (min) above it.
__device__ __forceinline__ void k_scale_min(const unsigned char* p, int s, float d, float dmin, float& scale,
                                            float& min) {
  int sc, mn;
  if (s < 4) {
    sc = p[s] & 63, mn = p[s + 4] & 63;
  } else {
    sc = (p[s + 4] & 0xf) | (p[s - 4] >> 6) << 4, mn = (p[s + 4] >> 4) | (p[s] >> 6) << 4;
  }
  scale = __fmul_rn(d, to_f(sc)), min = __fmul_rn(dmin, to_f(mn));
}

// Q4_K and Q5_K (kFive): half h of sub-block s is qs bytes 32 (s / 2) + 16h .. + 15, nibble s % 2, and for Q5_K
// bit s of qh bytes 16h .. 16h + 15.
template <bool kFive>
struct QK_Nibbles {
  static constexpr int kWeights = kSuper, kBytes = kFive ? 176 : 144;
  __device__ static __forceinline__ Half half(const unsigned char* super, int s, int h) {
    float scale, min;
    k_scale_min(super + 4, s, load_f16(super), load_f16(super + 2), scale, min);
    const Bytes16 qs = load_bytes16(super + (kFive ? 48 : 16) + 32 * (s / 2) + 16 * h);
    const Bytes16 qh = load_bytes16(super + 16 + 16 * h);  // Q4_K: unused, dropped by the compiler
    const int shift = 4 * (s % 2);
    return consecutive_half(h, [&](int i) {
      const int q = (qs[i] >> shift & 0xf) | (kFive ? (qh[i] >> s & 1) << 4 : 0);
      return __fadd_rn(__fmul_rn(scale, to_f(q)), -min);
    });
  }
};
using Q4_K = QK_Nibbles<false>;
using Q5_K = QK_Nibbles<true>;

struct Q6_K {
  static constexpr int kWeights = kSuper, kBytes = 210;
  // Half h of sub-block s: 16 weights with the one scale 2s + h.
  __device__ static __forceinline__ Half half(const unsigned char* super, int s, int h) {
    const int t = s % 4;
    const float scale = __fmul_rn(load_f16(super + 208), to_f(static_cast<signed char>(super[192 + 2 * s + h])));
    const Bytes16 ql = load_bytes16(super + 64 * (s / 4) + 32 * (t % 2) + 16 * h);
    const Bytes16 qh = load_bytes16(super + 128 + 32 * (s / 4) + 16 * h);
    return consecutive_half(h, [&](int i) {
      const int q = (ql[i] >> (4 * (t / 2)) & 0xf) | (qh[i] >> (2 * t) & 3) << 4;
      return __fmul_rn(scale, to_f(q - 32));
    });
  }
};

// Q2_K: half h of sub-block s is qs bytes 16 + 32 (s / 4) + 16h .. + 15, bits 2 (s % 4); scale byte 2s + h.
struct Q2_K {
  static constexpr int kWeights = kSuper, kBytes = 84;
  __device__ static __forceinline__ Half half(const unsigned char* super, int s, int h) {
    const int packed = super[2 * s + h];
    const float scale = __fmul_rn(load_f16(super + 80), to_f(packed & 0xf));
    const float min = __fmul_rn(load_f16(super + 82), to_f(packed >> 4));
    const Bytes16 qs = load_bytes16(super + 16 + 32 * (s / 4) + 16 * h);
    const int shift = 2 * (s % 4);
    return consecutive_half(h, [&](int i) { return __fadd_rn(__fmul_rn(scale, to_f(qs[i] >> shift & 3)), -min); });
  }
};

// Q3_K's 6-bit scale g from its 12 packed bytes (gguf's unpacking): the low 4 bits are byte g % 8's low (g < 8)
// or high nibble, the top 2 bits bits 2 (g / 4) of byte 8 + g % 4; less 32.
__device__ __forceinline__ int q3_k_scale(const unsigned char* p, int g) {
  return ((p[g % 8] >> (4 * (g / 8)) & 0xf) | (p[8 + g % 4] >> (2 * (g / 4)) & 3) << 4) - 32;
}

// Q3_K: half h of sub-block s is qs bytes 32 + 32 (s / 4) + 16h .. + 15, bits 2 (s % 4), with bit s of hmask
// bytes 16h .. + 15 above them; scale 2s + h.
struct Q3_K {
  static constexpr int kWeights = kSuper, kBytes = 110;
  __device__ static __forceinline__ Half half(const unsigned char* super, int s, int h) {
    const float scale = __fmul_rn(load_f16(super + 108), to_f(q3_k_scale(super + 96, 2 * s + h)));
    const Bytes16 qs = load_bytes16(super + 32 + 32 * (s / 4) + 16 * h);
    const Bytes16 hmask = load_bytes16(super + 16 * h);
    const int shift = 2 * (s % 4);
    return consecutive_half(h, [&](int i) {
      return __fmul_rn(scale, to_f((qs[i] >> shift & 3) + 4 * (hmask[i] >> s & 1) - 4));
    });
  }
};

// Bytes of one row of k weights.
template <typename Q>
__device__ __forceinline__ long long row_bytes(int k) {
  return static_cast<long long>(k / Q::kWeights) * Q::kBytes;
}

// Half h of 32-weight block `block` of a row.
template <typename Q>
__device__ __forceinline__ Half half_at(const unsigned char* row, int block, int h) {
  constexpr int kSubs = Q::kWeights / kBlock;
  return Q::half(row + static_cast<long long>(block / kSubs) * Q::kBytes, block % kSubs, h);
}

}  // namespace ps_quant

// Expands X(name, type, SUFFIX, T) once per stored type the kernels read: launch.QUANT_TYPES, in order.
#define PS_FOR_EACH_QUANT(X, SUFFIX, T)                                                                        \
  X(q4_0, Q4_0, SUFFIX, T) X(q4_1, Q4_1, SUFFIX, T) X(q8_0, Q8_0, SUFFIX, T) X(q5_0, Q5_0, SUFFIX, T)          \
  X(q5_1, Q5_1, SUFFIX, T) X(q4_k, Q4_K, SUFFIX, T) X(q5_k, Q5_K, SUFFIX, T) X(q6_k, Q6_K, SUFFIX, T)          \
  X(q2_k, Q2_K, SUFFIX, T) X(q3_k, Q3_K, SUFFIX, T)
