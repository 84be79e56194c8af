// What the attention kernels share: where a token's K/V row lives in the paged cache.
#pragma once

#include "common.cuh"

namespace ps {

// Elements of a head one lane owns in the decode kernel's split (head_dim / 16 lanes per token).
constexpr int kPerLane = 16;

// The first context position a query at position `last` sees: window > 0 (a sliding layer's) keeps the last
// `window` positions up to its own, (last - window, last]; 0 keeps them all. Nothing before it is read, so a block
// table entry wholly before the window may point anywhere (a window pool's -1, a block given back).
__device__ __forceinline__ int window_start(int last, int window) {
  return window > 0 && last + 1 > window ? last + 1 - window : 0;
}

// One kv head's view of a paged cache shaped (num_blocks, block_size, num_kv_heads, head_dim). kBlockSize > 0:
// the block size known when compiling (it must equal block_size), so a position's block and row within it are a
// shift and a mask; 0: any block size, by division.
template <int kBlockSize = 0>
struct KvLayout {
  int block_size, num_kv_heads, kv_head, head_dim;

  __device__ __forceinline__ int size() const { return kBlockSize > 0 ? kBlockSize : block_size; }

  // Element offset of the row for context position `pos` (>= 0) of the sequence whose block table row is `table`.
  __device__ __forceinline__ long long offset(const int* table, int pos) const {
    const long long block = table[pos / size()];
    return ((block * size() + pos % size()) * num_kv_heads + kv_head) * head_dim;
  }
};

}  // namespace ps
