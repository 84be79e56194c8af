// Writes a step's new K and V rows into their cache slots, before any attention reads them.
// The cache is (num_blocks, block_size, num_kv_heads, head_dim) row-major, so slot s (= block * block_size +
// offset) owns the contiguous run of num_kv_heads * head_dim elements at s * num_kv_heads * head_dim.
// Grid: (num_tokens). Block: any multiple of 32 threads. Slots < 0 are padding and skipped.
// key/value rows may be strided views (e.g. into a fused QKV output); strides and head_dim must be multiples
// of 16 bytes, so each row moves in 16-byte vectors.
#include "common.cuh"

namespace ps_cache {

template <typename T>
__device__ __forceinline__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int n) {
  constexpr int kVec = 16 / sizeof(T);
  using V = ps::Vec<T, kVec>;
  for (int i = threadIdx.x * kVec; i < n; i += blockDim.x * kVec) {
    *reinterpret_cast<V*>(dst + i) = *reinterpret_cast<const V*>(src + i);
  }
}

template <typename T>
__device__ __forceinline__ void reshape_and_cache(const T* __restrict__ key, const T* __restrict__ value,
                                                  T* __restrict__ k_cache, T* __restrict__ v_cache,
                                                  const long long* __restrict__ slot_mapping, int num_kv_heads,
                                                  int head_dim, int key_stride, int value_stride) {
  const long long token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  const int row = num_kv_heads * head_dim;
  copy_row(key + token * key_stride, k_cache + slot * row, row);
  copy_row(value + token * value_stride, v_cache + slot * row, row);
}

}  // namespace ps_cache

#define PS_DEFINE_RESHAPE_AND_CACHE(SUFFIX, T)                                                                 \
  extern "C" __global__ void reshape_and_cache_##SUFFIX(const T* key, const T* value, T* k_cache, T* v_cache,  \
                                                        const long long* slot_mapping, int num_kv_heads,       \
                                                        int head_dim, int key_stride, int value_stride) {      \
    ps_cache::reshape_and_cache<T>(key, value, k_cache, v_cache, slot_mapping, num_kv_heads, head_dim,        \
                                   key_stride, value_stride);                                                  \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_RESHAPE_AND_CACHE)
