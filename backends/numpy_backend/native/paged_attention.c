/* Decode attention over the paged KV cache, for the NumPy backend on the CPU: one call per layer.
 *
 * The reference is attention.decode_attention (NumPy); the per-sequence work is in attention.h, shared with
 * the fused step. The second entry point attends one sequence's prefill chunk (chunk_attention.h). Both take the
 * layer's window: a query at position p sees p - window + 1 .. p (0: every position up to p). */
#include "attention.h"
#include "chunk_attention.h"

/* q, out: (batch, heads, head_dim); block_tables: (batch, table_stride) int32; context_lens: (batch,) int32; the
 * cache's layers in float32, or in float16 when kv_half is 1.
 * With at least `parallel_min_tokens` of context in the batch, the sequences are shared out among OpenMP
 * threads (claimed one by one: their lengths differ), each with its own scratch; the same team that runs the
 * projections (matmul_rows.c), so no second pool fights it for the cores.
 * Needs head_dim % 8 == 0 and heads / kv_heads <= 16. Returns 0; -1 when scratch memory could not be
 * allocated; -2 for an unsupported shape; -3 for a context length outside 1..table_stride * block_size; -5 for a
 * block the attention reads (with a window, from the window's first position on) outside the cache's num_blocks. */
int decode_attention_f32(const float *q, const void *k_layer, const void *v_layer, const int32_t *block_tables,
                         const int32_t *context_lens, float *out, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         int64_t block_size, int64_t table_stride, float scale, int64_t batch,
                         int64_t parallel_min_tokens, int64_t kv_half, int64_t window, int64_t num_blocks) {
    if (head_dim % LANES != 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP
        || window < 0)
        return -2;
    const DecodeShape s = {heads, kv_heads, head_dim, block_size, table_stride, scale, 0, 0, kv_half != 0, window, 0};
    int64_t total;
    const int64_t max_ctx = max_context(context_lens, batch, table_stride * block_size, &total);
    if (max_ctx < 0) return (int)max_ctx;
    for (int64_t b = 0; b < batch; b++)
        if (!table_in_cache(block_tables + b * table_stride, window_first(context_lens[b] - 1, window), context_lens[b],
                            block_size, num_blocks))
            return -5;
    int status = 0;
    int64_t next_row = 0; /* shared by the team: rows are claimed from it */
    (void)parallel_min_tokens; /* read only by the pragma: unused when built without OpenMP */
#pragma omp parallel if (batch > 1 && total >= parallel_min_tokens)
    {
        Scratch w;
        const int ok = scratch_alloc(&w, heads, head_dim, max_ctx);
        if (!ok) {
#pragma omp atomic write
            status = -1;
        }
        if (ok)
            attend_claimed(&s, q, heads * head_dim, k_layer, v_layer, block_tables, context_lens, out,
                           heads * head_dim, batch, NULL, 1, &next_row, &w);
        scratch_free(&w);
    }
    return status;
}

/* One sequence's prefill chunk: q, out (n, heads, head_dim), the last n of its `context` positions, whose K/V
 * are already in the cache; table: the sequence's blocks (table_len of them, int32). With at least
 * `parallel_min_pairs` query-key pairs, the gather and then the (kv head, tile) items are shared out among
 * OpenMP threads. The cache as for decode_attention_f32. Returns 0; -1 when memory could not be allocated; -2
 * for an unsupported shape; -3 when n or context is outside 1..context, 1..table_len * block_size; -5 for a
 * block the chunk reads (with a window, from its first query's window start on) outside the cache. */
int chunk_attention_f32(const float *q, const void *k_layer, const void *v_layer, const int32_t *table,
                        int64_t table_len, int64_t num_blocks, int64_t context, int64_t n, float *out,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size, float scale,
                        int64_t parallel_min_pairs, int64_t kv_half, int64_t window) {
    if (head_dim % LANES != 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || block_size <= 0 || window < 0)
        return -2;
    if (n < 1 || context < n || context > table_len * block_size) return -3;
    if (!table_in_cache(table, window_first(context - n, window), context, block_size, num_blocks)) return -5;
    const ChunkShape c = chunk_geometry(n, context, heads, kv_heads, head_dim, scale, heads * head_dim, kv_half != 0,
                                        window);
    float *keys = malloc(sizeof(float) * (size_t)(2 * kv_heads * c.padded * head_dim));
    if (keys == NULL) return -1;
    float *values = keys + kv_heads * c.padded * head_dim;
    const int64_t tiles = (n + CHUNK_TILE - 1) / CHUNK_TILE;
    int status = 0;
    (void)parallel_min_pairs; /* read only by the pragma: unused when built without OpenMP */
#pragma omp parallel if (n * context >= parallel_min_pairs)
    {
        gather_kv(&c, k_layer, v_layer, table, block_size, keys, values);
        ChunkScratch w;
        const int ok = chunk_scratch_alloc(&w, &c);
        if (!ok) {
#pragma omp atomic write
            status = -1;
        }
#pragma omp for schedule(dynamic) /* every thread meets it, or the others would wait at its barrier */
        for (int64_t item = 0; item < kv_heads * tiles; item++)
            if (ok) chunk_tile(&c, q, item % kv_heads, item / kv_heads, keys, values, out, &w);
        free(w.q);
    }
    free(keys);
    return status;
}
