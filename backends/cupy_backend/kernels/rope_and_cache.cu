// Rotary position embedding fused with the KV cache write: one launch per layer where there were two.
// q is rotated in place (attention reads it from the fused QKV rows); each K row is rotated on its way into its
// cache slot and V is copied beside it (attention reads K and V from the cache only, so the QKV rows' own K is
// left as it was). RoPE rotates pairs of the first rot_dim elements of every head, interleaved (2i, 2i + 1), or
// NeoX's halves (i, i + rot_dim / 2) when `halves` is set (the architecture's rope_pairs):
// (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos); cos_sin_cache is float (max_position, rot_dim), row p holding
// cos(p * f_i) for i < rot_dim / 2, then the sines (precomputed on the host: exact angles for long positions,
// any frequency scheme). The cache is (num_blocks, block_size, num_kv_heads, head_dim) row-major: slot s (= block
// * block_size + offset) owns the num_kv_heads * head_dim elements at s * num_kv_heads * head_dim; slots < 0 are
// padding, written nowhere. Each rotated value is rounded to T once, as RoPE in place and then a copy would.
// Grid: (num_tokens). Block: any multiple of 32 threads. q and k/v rows are strided views (q_stride,
// kv_stride: elements between token rows).
#include "common.cuh"

namespace ps_rope {

// Where pair i of a head lies: its elements at first and first + step. Pairs from rot_dim / 2 on are the head's
// unrotated tail, elements (2i, 2i + 1) in either layout.
struct Pair {
  int first, step;
  __device__ __forceinline__ Pair(int i, int half, bool halves)
      : first(halves && i < half ? i : 2 * i), step(halves && i < half ? half : 1) {}
};

template <typename T>
__device__ __forceinline__ void rotate(const T* x, T* out, const Pair& p, float c, float s) {
  const float x0 = ps::to_float(x[p.first]), x1 = ps::to_float(x[p.first + p.step]);
  out[p.first] = ps::from_float<T>(x0 * c - x1 * s);
  out[p.first + p.step] = ps::from_float<T>(x0 * s + x1 * c);
}

// V's row in 16-byte vectors: n, the rows' strides and their starts are whole vectors (launch.rope_and_cache).
template <typename T>
__device__ __forceinline__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int n) {
  constexpr int kVec = 16 / sizeof(T);
  using V = ps::Vec<T, kVec>;
  for (int i = threadIdx.x * kVec; i < n; i += blockDim.x * kVec) {
    *reinterpret_cast<V*>(dst + i) = *reinterpret_cast<const V*>(src + i);
  }
}

template <typename T>
__device__ __forceinline__ void rope_and_cache(const int* __restrict__ positions, T* __restrict__ q,
                                               const T* __restrict__ k, const T* __restrict__ v,
                                               T* __restrict__ k_cache, T* __restrict__ v_cache,
                                               const long long* __restrict__ slot_mapping,
                                               const float* __restrict__ cos_sin_cache, int rot_dim, int num_heads,
                                               int num_kv_heads, int head_dim, int q_stride, int kv_stride,
                                               int halves) {
  const long long token = blockIdx.x;
  const int half = rot_dim / 2, head_pairs = head_dim / 2;
  const float* cs = cos_sin_cache + static_cast<long long>(positions[token]) * rot_dim;
  for (int p = threadIdx.x; p < num_heads * half; p += blockDim.x) {
    T* x = q + token * q_stride + (p / half) * head_dim;
    const int i = p % half;
    rotate(x, x, Pair(i, half, halves), cs[i], cs[half + i]);
  }
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  const int row = num_kv_heads * head_dim;
  const T* k_row = k + token * kv_stride;
  T* k_slot = k_cache + slot * row;
  for (int p = threadIdx.x; p < row / 2; p += blockDim.x) {
    const int i = p % head_pairs;  // the pair's index within its head
    const long long head = static_cast<long long>(p / head_pairs) * head_dim;
    if (i < half) {
      rotate(k_row + head, k_slot + head, Pair(i, half, halves), cs[i], cs[half + i]);
    } else {
      k_slot[2 * p] = k_row[2 * p];
      k_slot[2 * p + 1] = k_row[2 * p + 1];
    }
  }
  copy_row(v + token * kv_stride, v_cache + slot * row, row);
}

}  // namespace ps_rope

#define PS_DEFINE_ROPE_AND_CACHE(SUFFIX, T)                                                                     \
  extern "C" __global__ void rope_and_cache_##SUFFIX(const int* positions, T* q, const T* k, const T* v,      \
                                                     T* k_cache, T* v_cache, const long long* slot_mapping,     \
                                                     const float* cos_sin_cache, int rot_dim, int num_heads,    \
                                                     int num_kv_heads, int head_dim, int q_stride,              \
                                                     int kv_stride, int halves) {                               \
    ps_rope::rope_and_cache<T>(positions, q, k, v, k_cache, v_cache, slot_mapping, cos_sin_cache, rot_dim,     \
                               num_heads, num_kv_heads, head_dim, q_stride, kv_stride, halves);                 \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_ROPE_AND_CACHE)
