// Helpers shared by every kernel: dtype conversion, aligned vector loads, warp and block reductions.
// The same source builds for the GPU (nvcc / NVRTC) and, with the test emulation header included first, with g++
// on the CPU; the only difference between the two lives in this #ifdef.
#pragma once

#ifndef CUDA_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// Dynamic shared memory, sized by the launch's shared_mem bytes (see launch.py).
#define EXTERN_SHARED(type, name)                              \
  extern __shared__ __align__(16) unsigned char name##_raw_[]; \
  type* name = reinterpret_cast<type*>(name##_raw_)
#endif

// Expands X(suffix, type) once per storage dtype; the suffix ends every exported kernel name.
#define PS_FOR_EACH_DTYPE(X) X(f32, float) X(f16, __half) X(bf16, __nv_bfloat16)
// Expands X(suffix, type, head_dim) for the head sizes the attention kernels are compiled for.
#define PS_FOR_EACH_DTYPE_AND_HEAD_DIM(X)                                                                 \
  X(f32, float, 64) X(f32, float, 128) X(f32, float, 256) X(f16, __half, 64) X(f16, __half, 128)           \
  X(f16, __half, 256) X(bf16, __nv_bfloat16, 64) X(bf16, __nv_bfloat16, 128) X(bf16, __nv_bfloat16, 256)

namespace ps {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Stand-in for -inf in softmax: exp(kNegBig - m) is exactly 0, and it never makes NaN the way
// (-inf) - (-inf) would when a running max is still at its initial value.
constexpr float kNegBig = -1.0e30f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ int min_int(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// N elements moved as one aligned access: 16 bytes turns into a single 128-bit load on the GPU.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Loads N consecutive elements (p must be aligned to N * sizeof(T)) and widens them to float.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float* out) {
  const Vec<T, N> chunk = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(chunk.v[i]);
}

// Butterfly reductions over lanes whose index differs only in the bits from kFirst up to the warp size.
template <int kFirst = 1>
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = kFirst; o < kWarpSize; o <<= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
template <int kFirst = 1>
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = kFirst; o < kWarpSize; o <<= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}
// Sum over the kWidth consecutive lanes of a lane group (kWidth a power of two dividing the warp size).
template <int kWidth>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = 1; o < kWidth; o <<= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the result. Safe to call
// repeatedly: `total` is only rewritten after every thread has passed the previous call's last barrier.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float partial[kWarpSize];
  __shared__ float total;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  x = warp_sum(x);
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < int(blockDim.x / kWarpSize) ? partial[lane] : 0.0f;
    y = warp_sum(y);
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}

}  // namespace ps
