// Chunked-prefill attention over a paged KV cache, for a flattened batch of query chunks.
// Sequence b owns query rows query_start[b] .. query_start[b + 1] - 1; they are the LAST q_len positions of
// its context (context_lens[b] counts them, and their K/V are already in the cache), so query j sits at
// position context_lens[b] - q_len + j and attends to cache positions 0 .. that position: the cached prefix
// plus causal attention within the chunk. Decode rows are simply chunks of length 1. A sliding layer (window > 0)
// has each query see only the last `window` positions up to its own, and nothing before the first query's window
// is read.
//
// Grid: (num_heads, num_seqs, ceil(max_q_len / kQTile)). Block: kThreads. Dynamic shared memory:
// Smem<D>::kTotal floats (launch.prefill_shared_mem mirrors the layout; past 48 KiB for head_dim 256, which the
// launcher opts the kernel into).
// Each block stages kQTile queries, then streams the keys in tiles of kKTile rows through shared memory.
// Every warp owns kQPerWarp of the queries; for a query, lane j scores key j of the tile, and each lane
// accumulates head_dim / 32 output elements. Online softmax in float.
#include "attention_common.cuh"

namespace ps_prefill {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / ps::kWarpSize;
constexpr int kQPerWarp = 4;
constexpr int kQTile = kWarps * kQPerWarp;
constexpr int kKTile = ps::kWarpSize;

// Shared memory in floats: queries [kQTile][D], keys [kKTile][D + 1] (the pad puts lane j's row j in its own
// bank), values [kKTile][D], and per warp a row of scores and a row of probabilities [kKTile].
template <int D>
struct Smem {
  static constexpr int kQ = 0, kK = kQ + kQTile * D, kV = kK + kKTile * (D + 1), kS = kV + kKTile * D;
  static constexpr int kTotal = kS + kWarps * 2 * kKTile;
};

// Loads key/value rows [kt, kt + n) of the context into shared memory as float.
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(float* sk, float* sv, const T* k_cache, const T* v_cache,
                                             const int* table, const ps::KvLayout<>& kv, int kt, int n) {
  constexpr int kVec = 16 / sizeof(T), kVecsPerRow = D / kVec;
  for (int i = threadIdx.x; i < n * kVecsPerRow; i += kThreads) {
    const int j = i / kVecsPerRow, c = i % kVecsPerRow * kVec;
    const long long off = kv.offset(table, kt + j) + c;
    float k[kVec], v[kVec];
    ps::load_floats<T, kVec>(k_cache + off, k);
    ps::load_floats<T, kVec>(v_cache + off, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      sk[j * (D + 1) + c + e] = k[e];
      sv[j * D + c + e] = v[e];
    }
  }
}

// One query (scaled, in shared memory) against one key tile starting at position kt; the query sees keys lo..qpos,
// some of them in this tile (lo < kt + kKTile, qpos >= kt). Keys of the tile before lo (in an earlier query's
// window, so loaded and finite) score kNegBig and weigh an exact 0. Lane j scores key j; the tile max comes from the warp's score row, so the only warp-wide steps are three
// __syncwarp. l is kept per lane (each lane's own keys) and summed once at the end.
template <int D>
__device__ __forceinline__ void attend_tile(float& m, float& l, float (&acc)[D / ps::kWarpSize],
                                            const float* qrow, const float* sk, const float* sv,
                                            float* scores, float* probs, int kt, int qpos, int lo) {
  const int lane = threadIdx.x % ps::kWarpSize;
  const int n = ps::min_int(kKTile, qpos - kt + 1);  // the query sees keys lo - kt .. n - 1 of this tile
  const bool seen = lane >= lo - kt && lane < n;
  float s = ps::kNegBig;
  if (seen) {
    const float* krow = sk + lane * (D + 1);
    s = 0.0f;
#pragma unroll 16
    for (int d = 0; d < D; ++d) s += qrow[d] * krow[d];
  }
  scores[lane] = s;
  __syncwarp();
  float m_new = m;
  for (int j = 0; j < n; ++j) m_new = fmaxf(m_new, scores[j]);
  const float alpha = __expf(m - m_new);
  const float p = seen ? __expf(s - m_new) : 0.0f;
  l = l * alpha + p;
  probs[lane] = p;
  __syncwarp();
#pragma unroll
  for (int e = 0; e < D / ps::kWarpSize; ++e) acc[e] *= alpha;
  for (int j = 0; j < n; ++j) {
    const float pj = probs[j];
#pragma unroll
    for (int e = 0; e < D / ps::kWarpSize; ++e) acc[e] += pj * sv[j * D + lane + e * ps::kWarpSize];
  }
  __syncwarp();  // the score and probability rows are rewritten by the next query
  m = m_new;
}

template <typename T, int D>
__device__ __forceinline__ void prefill(T* __restrict__ out, const T* __restrict__ q,
                                        const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                        const int* __restrict__ block_tables, const int* __restrict__ context_lens,
                                        const int* __restrict__ query_start, float scale, int num_kv_heads,
                                        int max_blocks_per_seq, int block_size, int q_stride, int window) {
  constexpr int kE = D / ps::kWarpSize;
  EXTERN_SHARED(float, smem);
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int q_begin = query_start[seq], q_len = query_start[seq + 1] - q_begin;
  const int tile0 = blockIdx.z * kQTile;
  if (tile0 >= q_len) return;
  const int rows = ps::min_int(kQTile, q_len - tile0);
  const int first_pos = context_lens[seq] - q_len + tile0;  // position of this tile's first query
  const int key_end = first_pos + rows;  // the last query sees keys up to key_end - 1
  const int key_begin = ps::window_start(first_pos, window);  // the first query's first key: none is earlier
  const ps::KvLayout<> kv{block_size, num_kv_heads, head / (num_heads / num_kv_heads), D};
  const int* table = block_tables + static_cast<long long>(seq) * max_blocks_per_seq;
  const long long q_row0 = q_begin + tile0;

  float* sq = smem + Smem<D>::kQ;
  float* sk = smem + Smem<D>::kK;
  float* sv = smem + Smem<D>::kV;
  const int lane = threadIdx.x % ps::kWarpSize, warp = threadIdx.x / ps::kWarpSize;
  float* scores = smem + Smem<D>::kS + warp * 2 * kKTile;
  float* probs = scores + kKTile;
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    sq[i] = ps::to_float(q[(q_row0 + i / D) * q_stride + head * D + i % D]) * scale;
  }

  float m[kQPerWarp], l[kQPerWarp], acc[kQPerWarp][kE];
#pragma unroll
  for (int i = 0; i < kQPerWarp; ++i) {
    m[i] = ps::kNegBig;
    l[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[i][e] = 0.0f;
  }
  for (int kt = key_begin; kt < key_end; kt += kKTile) {
    __syncthreads();  // the previous tile is consumed (and, the first time, the queries are staged)
    load_kv_tile<T, D>(sk, sv, k_cache, v_cache, table, kv, kt, ps::min_int(kKTile, key_end - kt));
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kQPerWarp; ++i) {
      const int r = warp * kQPerWarp + i, lo = ps::window_start(first_pos + r, window);
      if (r < rows && kt <= first_pos + r && lo < kt + kKTile) {
        attend_tile<D>(m[i], l[i], acc[i], sq + r * D, sk, sv, scores, probs, kt, first_pos + r, lo);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kQPerWarp; ++i) {
    const int r = warp * kQPerWarp + i;
    const float l_sum = ps::warp_sum(l[i]);  // before the row check: every lane of the warp takes part
    if (r >= rows) continue;
    const float inv_l = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // l == 0 only for a malformed context_len
    T* o = out + ((q_row0 + r) * num_heads + head) * D;
#pragma unroll
    for (int e = 0; e < kE; ++e) o[lane + e * ps::kWarpSize] = ps::from_float<T>(acc[i][e] * inv_l);
  }
}

}  // namespace ps_prefill

#define PS_DEFINE_PREFILL(SUFFIX, T, D)                                                                      \
  extern "C" __global__ void __launch_bounds__(ps_prefill::kThreads) paged_prefill_attention_##SUFFIX##_d##D( \
      T* out, const T* q, const T* k_cache, const T* v_cache, const int* block_tables,                       \
      const int* context_lens, const int* query_start, float scale, int num_kv_heads, int max_blocks_per_seq, \
      int block_size, int q_stride, int window) {                                                            \
    ps_prefill::prefill<T, D>(out, q, k_cache, v_cache, block_tables, context_lens, query_start, scale,     \
                              num_kv_heads, max_blocks_per_seq, block_size, q_stride, window);               \
  }
PS_FOR_EACH_DTYPE_AND_HEAD_DIM(PS_DEFINE_PREFILL)
