// Decode attention over a paged KV cache: one query token per sequence attends to its whole context, walking
// the block table. Online softmax with float accumulation, so nothing scales with the context length in
// shared memory. GQA: query head h reads kv head h / (num_heads / num_kv_heads).
//
// A sliding layer (window > 0) attends to the last `window` positions only, and reads nothing before them.
//
// Grid: (num_heads, num_seqs, num_partitions). Block: kThreads. Partition z covers context positions
// [lo + z * partition_size, lo + (z + 1) * partition_size), lo the window's first position (0 without one). The
// plain kernel has one partition spanning the whole window and writes `out`; the partitioned one writes each
// partition's max logit, exp sum and normalised output, and paged_attention_reduce (paged_attention_reduce.cu)
// merges them.
//
// Work split: a lane group of kGroup = head_dim / 16 lanes owns kUnroll tokens at a time, each lane 16 of a
// token's head_dim elements (16-byte loads). A lane issues all its K and V loads for those tokens before the
// first product, so a warp keeps kUnroll times the bytes in flight that one token would (decode is bound by
// reading K and V), and folds them into its running softmax with one rescale. Every group keeps its own running
// max / sum / output over the tokens it visits, so the token loop needs no cross-group communication; the block
// merges all groups once at the end.
#include "attention_common.cuh"

namespace ps_decode {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / ps::kWarpSize;
// Blocks an SM must hold at once (registers capped to fit): the plain grid at batch 64 x 9 heads is 576 blocks,
// which at 4 a SM (the unrolled loads' registers, uncapped) would leave a second wave of 48 on 132 SMs.
constexpr int kMinBlocks = 5;

template <typename T, int D>
struct Split {
  static constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  static constexpr int kGroup = D / ps::kPerLane;  // lanes per token
  static constexpr int kLoads = ps::kPerLane / kVec;  // loads per lane per row
  static constexpr int kTokensPerWarp = ps::kWarpSize / kGroup;
  static constexpr int kGroups = kWarps * kTokensPerWarp;  // groups per block
  // Tokens a group loads before its first product: a lane's K and V loads of a trip are 128 bytes either way.
  // More spill under kMinBlocks' register cap (nvcc 13: 16-bit at 3 or 4 tokens, float32 at 2 on sm_80).
  static constexpr int kUnroll = sizeof(T) == 2 ? 2 : 1;
  static constexpr int kWarpTokens = kTokensPerWarp * kUnroll;  // tokens a warp takes per trip
  // Element offset of load j of lane `gl` within a row: a group's lanes read adjacent 16-byte chunks.
  static __device__ __forceinline__ int offset(int gl, int j) { return (gl + kGroup * j) * kVec; }
};

// A lane's share of its group's online softmax: running max m, sum l and unnormalised output acc.
struct State {
  float m, l, acc[ps::kPerLane];
};

// One lane's raw K and V slices of a group's kUnroll tokens, as loaded (16-byte vectors of T).
template <typename T, int D>
struct Rows {
  using S = Split<T, D>;
  ps::Vec<T, S::kVec> k[S::kUnroll][S::kLoads], v[S::kUnroll][S::kLoads];
  bool valid[S::kUnroll];

  // Token u of the group is position first + u * kTokensPerWarp; past `end` it loads position end - 1 again
  // and is marked invalid (no branch before the group's shuffle).
  template <typename Layout>
  __device__ __forceinline__ void load(const T* k_cache, const T* v_cache, const int* table, const Layout& kv,
                                       int first, int end, int gl) {
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u) {
      const int pos = first + u * S::kTokensPerWarp;
      valid[u] = pos < end;
      const long long off = kv.offset(table, ps::min_int(pos, end - 1));
#pragma unroll
      for (int j = 0; j < S::kLoads; ++j) {
        k[u][j] = *reinterpret_cast<const ps::Vec<T, S::kVec>*>(k_cache + off + S::offset(gl, j));
        v[u][j] = *reinterpret_cast<const ps::Vec<T, S::kVec>*>(v_cache + off + S::offset(gl, j));
      }
    }
  }

  // Element i of this lane's slice of token u's K or V row, as float.
  __device__ __forceinline__ float k_at(int u, int i) const { return ps::to_float(k[u][i / S::kVec].v[i % S::kVec]); }
  __device__ __forceinline__ float v_at(int u, int i) const { return ps::to_float(v[u][i / S::kVec].v[i % S::kVec]); }
};

// Folds a group's kUnroll tokens (their scores, this lane's V slices) into the running state with one rescale.
template <typename T, int D>
__device__ __forceinline__ void visit_tokens(State& st, const float (&score)[Split<T, D>::kUnroll],
                                             const Rows<T, D>& rows) {
  constexpr int kUnroll = Split<T, D>::kUnroll;
  float m_new = st.m;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) m_new = rows.valid[u] ? fmaxf(m_new, score[u]) : m_new;
  const float alpha = __expf(st.m - m_new);
  float p[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) p[u] = rows.valid[u] ? __expf(score[u] - m_new) : 0.0f;
  st.l *= alpha;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) st.l += p[u];
#pragma unroll
  for (int i = 0; i < ps::kPerLane; ++i) {
    float a = st.acc[i] * alpha;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) a += p[u] * rows.v_at(u, i);
    st.acc[i] = a;
  }
  st.m = m_new;
}

// Runs this lane's group over its share of the positions [start, end).
template <typename T, int D, typename Layout>
__device__ __forceinline__ State group_attend(const float* q, const T* k_cache, const T* v_cache,
                                              const int* table, const Layout& kv, int start, int end) {
  using S = Split<T, D>;
  const int lane = threadIdx.x % ps::kWarpSize, warp = threadIdx.x / ps::kWarpSize;
  const int group = lane / S::kGroup, gl = lane % S::kGroup;
  State st{ps::kNegBig, 0.0f, {}};
  // The trip count depends only on the warp, so every lane reaches the group shuffles together.
  for (int base = start + warp * S::kWarpTokens; base < end; base += kWarps * S::kWarpTokens) {
    Rows<T, D> rows;
    rows.load(k_cache, v_cache, table, kv, base + group, end, gl);
    float score[S::kUnroll];
#pragma unroll
    for (int u = 0; u < S::kUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < ps::kPerLane; ++i) dot += q[i] * rows.k_at(u, i);
      score[u] = ps::group_sum<S::kGroup>(dot);
    }
    visit_tokens<T, D>(st, score, rows);
  }
  return st;
}

// The block's merge of all groups: max logit m, exp sum l, and out[k] for element threadIdx.x + k * kThreads.
template <int D>
struct Merged {
  float m, l, out[(D + kThreads - 1) / kThreads];
};

// Merges every group's state through shared memory (groups that saw no token carry m = kNegBig, l = 0).
template <typename T, int D>
__device__ __forceinline__ Merged<D> merge_groups(const State& st) {
  using S = Split<T, D>;
  __shared__ float s_m[S::kGroups], s_l[S::kGroups], s_w[S::kGroups];
  __shared__ float s_acc[S::kGroups][D];
  const int lane = threadIdx.x % ps::kWarpSize, gl = lane % S::kGroup;
  const int g = threadIdx.x / ps::kWarpSize * S::kTokensPerWarp + lane / S::kGroup;
#pragma unroll
  for (int j = 0; j < S::kLoads; ++j) {
#pragma unroll
    for (int e = 0; e < S::kVec; ++e) s_acc[g][S::offset(gl, j) + e] = st.acc[j * S::kVec + e];
  }
  if (gl == 0) {
    s_m[g] = st.m;
    s_l[g] = st.l;
  }
  __syncthreads();
  Merged<D> r{ps::kNegBig, 0.0f, {}};
  for (int i = 0; i < S::kGroups; ++i) r.m = fmaxf(r.m, s_m[i]);
  for (int i = threadIdx.x; i < S::kGroups; i += kThreads) s_w[i] = __expf(s_m[i] - r.m);
  __syncthreads();
  for (int i = 0; i < S::kGroups; ++i) r.l += s_l[i] * s_w[i];
#pragma unroll
  for (int k = 0; k < (D + kThreads - 1) / kThreads; ++k) {
    const int d = threadIdx.x + k * kThreads;
    if (d >= D) break;
    float o = 0.0f;
    for (int i = 0; i < S::kGroups; ++i) o += s_acc[i][d] * s_w[i];
    r.out[k] = o / r.l;
  }
  return r;
}

template <typename T, int D, bool kPartial, int kBlockSize>
__device__ __forceinline__ void decode(T* __restrict__ out, float* __restrict__ exp_sums,
                                       float* __restrict__ max_logits, float* __restrict__ tmp_out,
                                       const T* __restrict__ q, const T* __restrict__ k_cache,
                                       const T* __restrict__ v_cache, const int* __restrict__ block_tables,
                                       const int* __restrict__ context_lens, float scale, int num_kv_heads,
                                       int max_blocks_per_seq, int block_size, int q_stride,
                                       int partition_size, int window) {
  using S = Split<T, D>;
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const long long row = static_cast<long long>(seq) * num_heads + head;
  const int ctx = context_lens[seq];
  const int lo = ps::window_start(ctx - 1, window);
  const int start = lo + (kPartial ? blockIdx.z * partition_size : 0);
  const int end = kPartial ? ps::min_int(start + partition_size, ctx) : ctx;
  if (start >= end) {
    // Past the context: the reduce kernel never reads this partition. An empty (padding) sequence gets zeros.
    if (!kPartial) {
      for (int d = threadIdx.x; d < D; d += kThreads) out[row * D + d] = ps::from_float<T>(0.0f);
    }
    return;
  }
  const ps::KvLayout<kBlockSize> kv{block_size, num_kv_heads, head / (num_heads / num_kv_heads), D};
  const int gl = threadIdx.x % ps::kWarpSize % S::kGroup;
  float qf[ps::kPerLane];
#pragma unroll
  for (int j = 0; j < S::kLoads; ++j) {
    ps::load_floats<T, S::kVec>(q + seq * static_cast<long long>(q_stride) + head * D + S::offset(gl, j),
                                qf + j * S::kVec);
  }
#pragma unroll
  for (int i = 0; i < ps::kPerLane; ++i) qf[i] *= scale;
  const int* table = block_tables + static_cast<long long>(seq) * max_blocks_per_seq;
  const Merged<D> r = merge_groups<T, D>(group_attend<T, D>(qf, k_cache, v_cache, table, kv, start, end));

  const long long part = row * gridDim.z + blockIdx.z;
#pragma unroll
  for (int k = 0; k < (D + kThreads - 1) / kThreads; ++k) {
    const int d = threadIdx.x + k * kThreads;
    if (d >= D) break;
    if (kPartial) {
      tmp_out[part * D + d] = r.out[k];
    } else {
      out[row * D + d] = ps::from_float<T>(r.out[k]);
    }
  }
  if (kPartial && threadIdx.x == 0) {
    max_logits[part] = r.m;
    exp_sums[part] = r.l;
  }
}

}  // namespace ps_decode

// Each kernel twice: for any block size, and with the KV pool's default block size of 16 compiled in
// (launch.DECODE_BLOCK_SIZES; names ending _b16).
#define PS_DECODE_KERNELS(SUFFIX, T, D, TAIL, BLOCK)                                                         \
  extern "C" __global__ void __launch_bounds__(ps_decode::kThreads, ps_decode::kMinBlocks)                 \
      paged_attention_decode_##SUFFIX##_d##D##TAIL(                                                          \
      T* out, const T* q, const T* k_cache, const T* v_cache, const int* block_tables,                       \
      const int* context_lens, float scale, int num_kv_heads, int max_blocks_per_seq, int block_size,        \
      int q_stride, int window) {                                                                            \
    ps_decode::decode<T, D, false, BLOCK>(out, nullptr, nullptr, nullptr, q, k_cache, v_cache, block_tables, \
                                          context_lens, scale, num_kv_heads, max_blocks_per_seq, block_size, \
                                          q_stride, 0, window);                                              \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(ps_decode::kThreads, ps_decode::kMinBlocks)                 \
      paged_attention_decode_partitioned_##SUFFIX##_d##D##TAIL(                                              \
      float* exp_sums, float* max_logits, float* tmp_out, const T* q, const T* k_cache, const T* v_cache,    \
      const int* block_tables, const int* context_lens, float scale, int num_kv_heads,                       \
      int max_blocks_per_seq, int block_size, int q_stride, int partition_size, int window) {                \
    ps_decode::decode<T, D, true, BLOCK>(nullptr, exp_sums, max_logits, tmp_out, q, k_cache, v_cache,       \
                                         block_tables, context_lens, scale, num_kv_heads, max_blocks_per_seq, \
                                         block_size, q_stride, partition_size, window);                      \
  }
#define PS_DEFINE_DECODE(SUFFIX, T, D) PS_DECODE_KERNELS(SUFFIX, T, D, , 0) PS_DECODE_KERNELS(SUFFIX, T, D, _b16, 16)
PS_FOR_EACH_DTYPE_AND_HEAD_DIM(PS_DEFINE_DECODE)
