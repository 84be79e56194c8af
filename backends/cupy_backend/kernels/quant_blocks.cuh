// Blocks of 32 weights as a GGUF file stores them, dequantized exactly as the `gguf` package's NumPy code
// computes them (the reference: backends/model/quant.py's QuantMatrix.dequantize):
//   Q4_0  f16 d, 16 bytes of nibbles           value d * (q - 8)
//   Q4_1  f16 d, f16 m, 16 bytes of nibbles    value d * q + m
//   Q8_0  f16 d, 32 int8                       value d * q
// Nibble byte j holds weight j in its low half and weight j + 16 in its high half. The operations are gguf's,
// each rounded to float on its own (__fmul_rn, __fadd_rn: NVCC never contracts them into an FMA). d * q is
// exact in float anyway (an 11-bit float16 mantissa times a 4- or 8-bit integer), so only Q4_1's + m rounds.
//
// A block is read as two halves of 16 weights, each half two runs of 8 consecutive weights: the unit one thread
// dequantizes and multiplies with 16-byte vectors of activations. Blocks are 18, 20 and 34 bytes long, so in a
// row of blocks every field starts at an even offset: all bytes are read with 2-byte loads.
#pragma once

#include "common.cuh"

namespace ps_quant {

constexpr int kBlock = 32;  // weights per block
constexpr int kHalves = 2;  // halves per block
constexpr int kRun = 8;     // consecutive weights per run; two runs per half

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

// Nibble bytes 8h .. 8h + 7 of a Q4 block: low nibbles are weights 8h + i, high nibbles 16 + 8h + i.
template <typename Value>
__device__ __forceinline__ Half nibble_half(const unsigned char* nibbles, int h, Value value) {
  Half out{{}, {8 * h, 16 + 8 * h}};
  const unsigned char* bytes = nibbles + 8 * h;
#pragma unroll
  for (int i = 0; i < kRun; i += 2) {
    const unsigned two = load_u16(bytes + i);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const unsigned byte = (two >> (8 * j)) & 0xffu;
      out.w[0][i + j] = value(static_cast<int>(byte & 0xfu));
      out.w[1][i + j] = value(static_cast<int>(byte >> 4));
    }
  }
  return out;
}

struct Q4_0 {
  static constexpr int kBytes = 18;
  __device__ static __forceinline__ Half half(const unsigned char* block, int h) {
    const float d = load_f16(block);
    return nibble_half(block + 2, h, [d](int q) { return __fmul_rn(d, static_cast<float>(q - 8)); });
  }
};

struct Q4_1 {
  static constexpr int kBytes = 20;
  __device__ static __forceinline__ Half half(const unsigned char* block, int h) {
    const float d = load_f16(block), m = load_f16(block + 2);
    return nibble_half(block + 4, h, [d, m](int q) { return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m); });
  }
};

struct Q8_0 {
  static constexpr int kBytes = 34;
  // Bytes 16h .. 16h + 15: weights 16h + i, as signed 8-bit integers.
  __device__ static __forceinline__ Half half(const unsigned char* block, int h) {
    const float d = load_f16(block);
    const unsigned char* q = block + 2 + 16 * h;
    Half out{{}, {16 * h, 16 * h + kRun}};
#pragma unroll
    for (int i = 0; i < 2 * kRun; i += 2) {
      const unsigned two = load_u16(q + i);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const auto value = static_cast<signed char>((two >> (8 * j)) & 0xffu);
        out.w[(i + j) / kRun][(i + j) % kRun] = __fmul_rn(d, static_cast<float>(value));
      }
    }
    return out;
  }
};

// Bytes of one row of k weights.
template <typename Q>
__device__ __forceinline__ long long row_bytes(int k) {
  return static_cast<long long>(k / kBlock) * Q::kBytes;
}

}  // namespace ps_quant
