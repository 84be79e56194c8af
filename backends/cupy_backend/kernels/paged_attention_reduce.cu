// Merges the partitions written by paged_attention_decode_partitioned_* into the final output:
// out = sum_p o_p * l_p * e^(m_p - M) / sum_p l_p * e^(m_p - M), M the max over the valid partitions.
// Grid: (num_heads, num_seqs). Block: any multiple of 32 threads (one output element per thread and step).
// Partials are (num_seqs, num_heads, max_partitions[, head_dim]) float; only the first
// ceil(span / partition_size) partitions of a sequence were written and are read here, span the positions its
// query sees (the context, or a sliding layer's window of it: `window` as the decode kernel was given it).
#include "attention_common.cuh"

namespace ps_reduce {

template <typename T, int D>
__device__ __forceinline__ void reduce(T* __restrict__ out, const float* __restrict__ exp_sums,
                                       const float* __restrict__ max_logits, const float* __restrict__ tmp_out,
                                       const int* __restrict__ context_lens, int max_partitions,
                                       int partition_size, int window) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const long long row = static_cast<long long>(seq) * gridDim.x + head;
  const int ctx = context_lens[seq];
  const int n = ps::ceil_div(ctx - ps::window_start(ctx - 1, window), partition_size);
  const float* sums = exp_sums + row * max_partitions;
  const float* maxes = max_logits + row * max_partitions;
  float m = ps::kNegBig, l = 0.0f;
  for (int p = 0; p < n; ++p) m = fmaxf(m, maxes[p]);
  for (int p = 0; p < n; ++p) l += sums[p] * __expf(maxes[p] - m);
  // An empty (padding) sequence has no partitions and gets zeros.
  const float inv_l = n > 0 ? 1.0f / l : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int p = 0; p < n; ++p) o += tmp_out[(row * max_partitions + p) * D + d] * sums[p] * __expf(maxes[p] - m);
    out[row * D + d] = ps::from_float<T>(o * inv_l);
  }
}

}  // namespace ps_reduce

#define PS_DEFINE_REDUCE(SUFFIX, T, D)                                                                       \
  extern "C" __global__ void paged_attention_reduce_##SUFFIX##_d##D(                                         \
      T* out, const float* exp_sums, const float* max_logits, const float* tmp_out, const int* context_lens, \
      int max_partitions, int partition_size, int window) {                                                 \
    ps_reduce::reduce<T, D>(out, exp_sums, max_logits, tmp_out, context_lens, max_partitions,               \
                            partition_size, window);                                                        \
  }
PS_FOR_EACH_DTYPE_AND_HEAD_DIM(PS_DEFINE_REDUCE)
