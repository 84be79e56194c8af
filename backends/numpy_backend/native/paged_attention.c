/* Decode attention over the paged KV cache, for the NumPy backend on the CPU: one call per layer.
 *
 * The reference is attention.decode_attention (NumPy); the per-sequence work is in attention.h, shared with
 * the fused step. */
#include "attention.h"

/* q, out: (batch, heads, head_dim); block_tables: (batch, table_stride) int32; context_lens: (batch,) int32.
 * With at least `parallel_min_tokens` of context in the batch, the sequences are shared out among OpenMP
 * threads (claimed one by one: their lengths differ), each with its own scratch; the same team that runs the
 * projections (matmul_rows.c), so no second pool fights it for the cores.
 * Needs head_dim % 8 == 0 and heads / kv_heads <= 16. Returns 0; -1 when scratch memory could not be
 * allocated; -2 for an unsupported shape; -3 for a context length outside 1..table_stride * block_size. */
int decode_attention_f32(const float *q, const float *k_layer, const float *v_layer, const int32_t *block_tables,
                         const int32_t *context_lens, float *out, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         int64_t block_size, int64_t table_stride, float scale, int64_t batch,
                         int64_t parallel_min_tokens) {
    if (head_dim % LANES != 0 || kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP) return -2;
    const DecodeShape s = {heads, kv_heads, head_dim, block_size, table_stride, scale};
    int64_t total;
    const int64_t max_ctx = max_context(context_lens, batch, table_stride * block_size, &total);
    if (max_ctx < 0) return (int)max_ctx;
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
                           heads * head_dim, batch, &next_row, &w);
        scratch_free(&w);
    }
    return status;
}
