// Rotary position embedding, in place on q and k, on interleaved pairs (2i, 2i + 1) of the first rot_dim
// elements of every head: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos).
// cos_sin_cache is float (max_position, rot_dim): row p holds cos(p * f_i) for i < rot_dim / 2, then the
// sines. Precomputing it on the host keeps the angles exact for long positions and lets any frequency
// scheme (plain theta, per-pair factors) use the same kernel.
// Grid: (num_tokens). Block: any multiple of 32 threads. q/k rows may be strided views (q_stride, k_stride).
#include "common.cuh"

namespace ps_rope {

template <typename T>
__device__ __forceinline__ void rotate_pair(T* x, float c, float s) {
  const float x0 = ps::to_float(x[0]), x1 = ps::to_float(x[1]);
  x[0] = ps::from_float<T>(x0 * c - x1 * s);
  x[1] = ps::from_float<T>(x0 * s + x1 * c);
}

template <typename T>
__device__ __forceinline__ void rope(const int* __restrict__ positions, T* __restrict__ q, T* __restrict__ k,
                                     const float* __restrict__ cos_sin_cache, int rot_dim, int num_heads,
                                     int num_kv_heads, int head_dim, int q_stride, int k_stride) {
  const long long token = blockIdx.x;
  const int half = rot_dim / 2;
  const float* cs = cos_sin_cache + static_cast<long long>(positions[token]) * rot_dim;
  const int pairs = (num_heads + num_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    T* x = head < num_heads ? q + token * q_stride + head * head_dim
                            : k + token * k_stride + (head - num_heads) * head_dim;
    rotate_pair(x + 2 * i, cs[i], cs[half + i]);
  }
}

}  // namespace ps_rope

#define PS_DEFINE_ROPE(SUFFIX, T)                                                                            \
  extern "C" __global__ void rope_##SUFFIX(const int* positions, T* q, T* k, const float* cos_sin_cache,     \
                                           int rot_dim, int num_heads, int num_kv_heads, int head_dim,       \
                                           int q_stride, int k_stride) {                                     \
    ps_rope::rope<T>(positions, q, k, cos_sin_cache, rot_dim, num_heads, num_kv_heads, head_dim, q_stride,  \
                     k_stride);                                                                              \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_ROPE)
