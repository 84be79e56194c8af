/* Decode attention over the paged KV cache, for the NumPy backend on the CPU: the per-sequence pieces, shared
 * by the standalone kernel (paged_attention.c) and the fused step (fused_step.c).
 *
 * One query token per sequence. The NumPy reference (attention.decode_attention) gathers every sequence's
 * blocks into a padded copy and runs two batched matmuls; here each (sequence, kv head) pair reads its keys
 * and values straight from the block pool once, for all the query heads that share that kv head (GQA), so
 * nothing is copied and no padding is computed. Cache layout, per layer: (num_blocks, block_size, kv_heads,
 * head_dim), rows contiguous, in float32 or float16 (kv_half: half the bytes to read, each value widened exactly
 * to float32 as it is loaded). Query heads h = kv_head * group + g, as in the reference.
 *
 * Softmax is exact and two-pass (scores first, then exp and the weighted sum), in float32 with the max
 * subtracted, matching the reference to float32 rounding.
 *
 * A sliding layer (window > 0) attends to the last `window` positions only: its rows start at the window's first
 * position, inside some block of the table (the cursor's skip), and nothing before it is read.
 */
#ifndef PAGEDSERVE_ATTENTION_H
#define PAGEDSERVE_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "half.h"
#include "simd.h"
#include "softmax.h"

#define MAX_GROUP 16

typedef struct {
    int64_t heads, kv_heads, head_dim, block_size, table_stride;
    float scale;
    int64_t kv_first, kv_count; /* the kv heads (and their query heads) to attend: 0, 0 means all */
    int64_t kv_half;            /* 1: the cache holds float16, 0: float32 */
    int64_t window;             /* a query at position p sees p - window + 1 .. p; 0: the whole context */
    int64_t skip;               /* the sequence's rows before its first attended one in its table's first block */
} DecodeShape;

#define INLINE static inline __attribute__((always_inline))

/* Bytes of one cached value, and 8 values c * 8 .. c * 8 + 7 of a cached row as floats. Inlined into copies for
 * each element type (attend_dispatch), so the branch is gone from the loops. */
INLINE int64_t kv_bytes(int half) { return half ? 2 : 4; }
INLINE vec8 kv_load8(const char *row, int64_t c, int half) {
    return half ? deq8_f16((const uint8_t *)row + c * 16) : *(const vec8 *)(row + c * 32);
}

#if defined(SIMD_NEON)
/* kv_load8 as a NEON pair (simd.h), for the NEON loops below. */
INLINE pair8 kv_pair(const char *row, int64_t c, int half) {
    return half ? half_pair((const uint8_t *)row + c * 16) : load_pair(row + c * 32);
}
#endif

/* The kv heads [first, first + count) that `s` attends. */
static inline int64_t kv_first(const DecodeShape *s) { return s->kv_count ? s->kv_first : 0; }
static inline int64_t kv_end(const DecodeShape *s) { return s->kv_count ? s->kv_first + s->kv_count : s->kv_heads; }

/* Scores of one query against 8 key rows: 8 independent FMA chains, then one hsum8. */
#if defined(SIMD_NEON)
INLINE vec8 scores8(const vec8 *q, const char *const *k, int64_t chunks, int half) {
    pair8 acc[LANES];
#pragma GCC unroll 8
    for (int j = 0; j < LANES; j++) acc[j] = zero_pair();
    for (int64_t c = 0; c < chunks; c++) {
        const pair8 qc = load_pair(q + c);
#pragma GCC unroll 8
        for (int j = 0; j < LANES; j++) acc[j] = fma_pair(qc, kv_pair(k[j], c, half), acc[j]);
    }
    return hsum8_pairs(acc);
}

/* row_scores below with NEON pairs: the same two chains a head, summed in hsum's order. */
INLINE void row_scores(const vec8 *q, const char *k, int64_t chunks, int64_t group, float scale, float *scores,
                       int64_t stride, int half) {
    pair8 even[MAX_GROUP], odd[MAX_GROUP];
#pragma GCC unroll 16
    for (int64_t g = 0; g < group; g++) even[g] = odd[g] = zero_pair();
    for (int64_t c = 0; c + 1 < chunks; c += 2) {
        const pair8 k0 = kv_pair(k, c, half), k1 = kv_pair(k, c + 1, half);
#pragma GCC unroll 16
        for (int64_t g = 0; g < group; g++) {
            even[g] = fma_pair(load_pair(q + g * chunks + c), k0, even[g]);
            odd[g] = fma_pair(load_pair(q + g * chunks + c + 1), k1, odd[g]);
        }
    }
    if (chunks % 2) {
        const pair8 last = kv_pair(k, chunks - 1, half);
#pragma GCC unroll 16
        for (int64_t g = 0; g < group; g++) even[g] = fma_pair(load_pair(q + g * chunks + chunks - 1), last, even[g]);
    }
    for (int64_t g = 0; g < group; g++)
        scores[g * stride] = scale * hsum_tree_pair((pair8){vaddq_f32(even[g].lo, odd[g].lo),
                                                            vaddq_f32(even[g].hi, odd[g].hi)});
}
#else
INLINE vec8 scores8(const vec8 *q, const char *const *k, int64_t chunks, int half) {
    vec8 acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = q[0] * kv_load8(k[j], 0, half);
    for (int64_t c = 1; c < chunks; c++)
        for (int j = 0; j < LANES; j++) acc[j] += q[c] * kv_load8(k[j], c, half);
    return hsum8(acc);
}

/* Scores of the group's queries against one key row: scores[g * stride] = scale * q_g . k. Inlined into
 * per-group-size copies (see for_group) so the accumulators live in registers. */
INLINE void row_scores(const vec8 *q, const char *k, int64_t chunks, int64_t group, float scale, float *scores,
                       int64_t stride, int half) {
    vec8 even[MAX_GROUP], odd[MAX_GROUP]; /* two chains per head: the FMAs' latency, not their count, binds */
    for (int64_t g = 0; g < group; g++) even[g] = odd[g] = (vec8){0};
    for (int64_t c = 0; c + 1 < chunks; c += 2)
        for (int64_t g = 0; g < group; g++) {
            even[g] += q[g * chunks + c] * kv_load8(k, c, half);
            odd[g] += q[g * chunks + c + 1] * kv_load8(k, c + 1, half);
        }
    if (chunks % 2)
        for (int64_t g = 0; g < group; g++) even[g] += q[g * chunks + chunks - 1] * kv_load8(k, chunks - 1, half);
    for (int64_t g = 0; g < group; g++) scores[g * stride] = scale * hsum(even[g] + odd[g]);
}
#endif

/* In place: scores -> exp(scores - max); returns their sum. */
static float exp_and_sum(float *scores, int64_t n) {
    const float top = max_score(scores, n);
    float total = 0.0f;
    int64_t i = 0;
    vec8 sums = {0};
    for (; i + LANES <= n; i += LANES) {
        vec8 e = exp_nonpositive(*(vec8 *)(scores + i) - top);
        *(vec8 *)(scores + i) = e;
        sums += e;
    }
    for (; i < n; i++) {
        scores[i] = expf(scores[i] - top);
        total += scores[i];
    }
    return total + hsum(sums);
}

/* Walks a sequence's token rows (kv_heads * head_dim values each, `row` bytes) through its block table in order. With
 * `prefetch`, each step also prefetches the same row of the next block, so that block arrives while this one
 * is computed: blocks are scattered, which stops the hardware prefetcher at every block's end. */
typedef struct {
    const char *layer;
    const int32_t *table;
    int64_t block, offset, blocks, block_size, row;
    int prefetch;
} RowCursor;

/* Bytes of one token's cached row (every kv head). */
INLINE int64_t row_bytes(const DecodeShape *s, int half) { return s->kv_heads * s->head_dim * kv_bytes(half); }

/* A cursor over ctx rows from row `skip` of the table's first block. */
INLINE RowCursor cursor_at(const DecodeShape *s, const void *layer, const int32_t *table, int64_t skip, int64_t ctx,
                           int prefetch, int half) {
    const int64_t blocks = (skip + ctx + s->block_size - 1) / s->block_size;
    return (RowCursor){layer, table, 0, skip, blocks, s->block_size, row_bytes(s, half), prefetch};
}

INLINE RowCursor cursor_at_start(const DecodeShape *s, const void *layer, const int32_t *table, int64_t ctx,
                                 int prefetch, int half) {
    return cursor_at(s, layer, table, s->skip, ctx, prefetch, half);
}

INLINE const char *cursor_next(RowCursor *c) {
    const char *row = c->layer + ((int64_t)c->table[c->block] * c->block_size + c->offset) * c->row;
    if (c->prefetch && c->block + 1 < c->blocks) {
        const int64_t next = (int64_t)c->table[c->block + 1] * c->block_size + c->offset;
        const char *ahead = c->layer + next * c->row;
        for (int64_t byte = 0; byte < c->row; byte += 64) __builtin_prefetch(ahead + byte, 0, PREFETCH_LOCALITY);
    }
    if (++c->offset == c->block_size) {
        c->offset = 0;
        c->block++;
    }
    return row;
}

/* Prefetches one token row (`bytes` long) into L2. */
static inline void prefetch_row(const char *row, int64_t bytes) {
    for (int64_t byte = 0; byte < bytes; byte += 64) __builtin_prefetch(row + byte, 0, PREFETCH_LOCALITY);
}

#define MAX_WIDENED 16 /* head_dim / 8 up to which a float16 key's head slice is widened once for its group */

/* The 8 float16 key slices widened to float32 into `to` (chunks vectors each), and keys[] pointed at them, for
 * the group's query heads to share: widened at each use, each value was converted once per query head (with
 * the softmax's max taken 8 lanes at a time, that was 4 % of a batch-64 step's attention). */
INLINE void widen_keys(const char **keys, int64_t chunks, vec8 *to) {
    for (int j = 0; j < LANES; j++) {
        for (int64_t c = 0; c < chunks; c++) to[j * chunks + c] = kv_load8(keys[j], c, 1);
        keys[j] = (const char *)(to + j * chunks);
    }
}

/* scores (heads, ctx) of one sequence, 8 tokens at a time (the tail one by one); every key row is read from
 * memory once, for all the query heads that share it. With each key row, the value row of the same token is
 * prefetched: this pass leaves the bus half idle, and the value pass then finds its rows in L2 (a batch-64
 * step's attention: 36 -> 32 ms). */
INLINE void sequence_scores(const DecodeShape *s, const vec8 *q, const void *k_layer, const int32_t *table,
                            int64_t ctx, int64_t group, int64_t chunks, float *scores, const void *v_layer, int half) {
    RowCursor cursor = cursor_at_start(s, k_layer, table, ctx, 1, half);
    RowCursor values = cursor_at_start(s, v_layer, table, ctx, 0, half);
    const int64_t head_bytes = s->head_dim * kv_bytes(half);
    const char *rows[LANES], *keys[LANES];
    int64_t t = 0;
    for (; t + LANES <= ctx; t += LANES) {
        for (int j = 0; j < LANES; j++) rows[j] = cursor_next(&cursor);
        for (int j = 0; j < LANES; j++) prefetch_row(cursor_next(&values), values.row);
        for (int64_t h = kv_first(s); h < kv_end(s); h++) {
            vec8 widened[LANES * MAX_WIDENED];
            const int widen = half && group > 1 && chunks <= MAX_WIDENED; /* constants once specialised */
            for (int j = 0; j < LANES; j++) keys[j] = rows[j] + h * head_bytes;
            if (widen) widen_keys(keys, chunks, widened);
            for (int64_t g = h * group; g < (h + 1) * group; g++)
                *(vec8 *)(scores + g * ctx + t) = s->scale * scores8(q + g * chunks, keys, chunks, half && !widen);
        }
    }
    for (; t < ctx; t++) {
        prefetch_row(cursor_next(&values), values.row);
        const char *row = cursor_next(&cursor);
        for (int64_t h = kv_first(s); h < kv_end(s); h++)
            row_scores(q + h * group * chunks, row + h * head_bytes, chunks, group, s->scale,
                       scores + h * group * ctx + t, ctx, half);
    }
}

/* Turn the scores (heads, ctx) of query heads first..end - 1 into unnormalised probabilities; inv_sums gets
 * 1 / their sums. */
static void softmax_rows(float *scores, int64_t first, int64_t end, int64_t ctx, float *inv_sums) {
    for (int64_t h = first; h < end; h++) inv_sums[h] = 1.0f / exp_and_sum(scores + h * ctx, ctx);
}

/* acc (heads * chunks vectors) = probs @ V for one sequence, in one pass over the value rows: each row is read
 * once, for every query head, into accumulators that stay in L1 (heads * head_dim floats). A pass per kv head
 * and register tile, as before, read each row six times and took 2.4x as long at batch 64. Its rows were
 * prefetched during the key pass; with each one it prefetches a key row of the thread's next sequence (`ahead`,
 * ahead_ctx rows of it), whose key pass then finds its keys in L2. */
INLINE void values_all_heads(const DecodeShape *s, const void *v_layer, const int32_t *table, int64_t ctx,
                             int64_t group, int64_t chunks, const float *probs, vec8 *acc, RowCursor *ahead,
                             int64_t ahead_ctx, int half) {
    for (int64_t i = kv_first(s) * group * chunks; i < kv_end(s) * group * chunks; i++) acc[i] = (vec8){0};
    RowCursor cursor = cursor_at_start(s, v_layer, table, ctx, 1, half);
    for (int64_t t = 0; t < ctx; t++) {
        if (t < ahead_ctx) prefetch_row(cursor_next(ahead), ahead->row);
        const char *row = cursor_next(&cursor);
        for (int64_t h = kv_first(s); h < kv_end(s); h++)
            for (int64_t g = 0; g < group; g++) {
                const float p = probs[(h * group + g) * ctx + t];
                vec8 *sums = acc + (h * group + g) * chunks;
#if defined(SIMD_NEON)
                const pair8 weight = broadcast_pair(p);
                for (int64_t i = 0; i < chunks; i++)
                    store_pair(sums + i, fma_pair(weight, kv_pair(row, h * chunks + i, half), load_pair(sums + i)));
#else
                for (int64_t i = 0; i < chunks; i++) sums[i] += p * kv_load8(row, h * chunks + i, half);
#endif
            }
    }
}

#define REGISTER_SUMS 24 /* accumulator vectors that fit AVX-512's 32 registers (AVX2's 16: some spill to L1) */

#if defined(SIMD_NEON)
#define NEON_SUMS 12 /* accumulator pairs a NEON pass keeps in registers: 24 of the 32 */

/* values_by_columns (the x86 path) with NEON pairs, one pass a kv head: where a kv head's group * chunks accumulators are more than NEON_SUMS pairs
 * and chunks is even, its columns in two passes (each reading its half of the head's slice of every row: each
 * line still read once). Each output's sum is the generic one's: the same FMAs in token order. */
INLINE void values_by_head(const DecodeShape *s, const void *v_layer, const int32_t *table, int64_t ctx,
                           int64_t group, int64_t chunks, const float *probs, vec8 *acc, RowCursor *ahead,
                           int64_t ahead_ctx, int half) {
    const int64_t head_bytes = s->head_dim * kv_bytes(half);
    /* columns (vec8s) a pass: a constant where group and chunks are, so the loops over them unroll */
    const int64_t cols = group * chunks > NEON_SUMS && chunks % 2 == 0 ? chunks / 2 : chunks;
    for (int64_t h = kv_first(s); h < kv_end(s); h++)
        for (int64_t first = 0; first < chunks; first += cols) {
            pair8 sums[REGISTER_SUMS];
#pragma GCC unroll 24
            for (int64_t i = 0; i < group * cols; i++) sums[i] = zero_pair();
            RowCursor cursor = cursor_at_start(s, v_layer, table, ctx, h == kv_first(s) && first == 0, half);
            const float *p = probs + h * group * ctx;
            const int ahead_here = h + 1 == kv_end(s) && first + cols == chunks; /* the last pass */
            for (int64_t t = 0; t < ctx; t++) {
                if (ahead_here && t < ahead_ctx) prefetch_row(cursor_next(ahead), ahead->row);
                const char *row = cursor_next(&cursor) + h * head_bytes;
#pragma GCC unroll 16
                for (int64_t i = 0; i < cols; i++) {
                    const pair8 v = kv_pair(row, first + i, half);
#pragma GCC unroll 16
                    for (int64_t g = 0; g < group; g++)
                        sums[g * cols + i] = fma_pair(v, broadcast_pair(p[g * ctx + t]), sums[g * cols + i]);
                }
            }
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++)
#pragma GCC unroll 16
                for (int64_t i = 0; i < cols; i++)
                    store_pair(acc + (h * group + g) * chunks + first + i, sums[g * cols + i]);
        }
}
#else
/* The widest strip of a head's columns (vec8s) whose sums for every query head of a group fit REGISTER_SUMS: a
 * divisor of chunks; 0 when not even two columns do. */
static inline int64_t column_strip(int64_t group, int64_t chunks) {
    for (int64_t cols = REGISTER_SUMS / group; cols >= 2; cols--)
        if (chunks % cols == 0) return cols;
    return 0;
}

/* acc by kv head and strip of `cols` columns (vec8s), its query heads' sums in registers: a pass over the value
 * rows for each kv head and strip, reading only its part of each row, so each line is still read once (the passes
 * per kv head and register tile of an earlier version read whole rows each time). Kept in L1, as values_all_heads
 * keeps them, the sums cost a load and a store beside every FMA, and each float16 value was widened once per query head.
 * cols = chunks where a head's sums fit the registers (one pass a kv head); a strip where they do not and the
 * head is wide (Gemma 3: 4 query heads of 256 per kv head). The first pass prefetches the next block's rows as
 * values_all_heads does; the last, the next sequence's keys (`ahead`). Each output's sum is values_all_heads':
 * the same FMAs in token order. */
INLINE void values_by_columns(const DecodeShape *s, const void *v_layer, const int32_t *table, int64_t ctx,
                              int64_t group, int64_t chunks, int64_t cols, const float *probs, vec8 *acc,
                              RowCursor *ahead, int64_t ahead_ctx, int half) {
    const int64_t head_bytes = s->head_dim * kv_bytes(half);
    for (int64_t h = kv_first(s); h < kv_end(s); h++)
        for (int64_t first = 0; first < chunks; first += cols) {
            vec8 sums[REGISTER_SUMS];
            for (int64_t i = 0; i < group * cols; i++) sums[i] = (vec8){0};
            RowCursor cursor = cursor_at_start(s, v_layer, table, ctx, h == kv_first(s) && first == 0, half);
            const float *p = probs + h * group * ctx;
            const int last = h + 1 == kv_end(s) && first + cols == chunks;
            for (int64_t t = 0; t < ctx; t++) {
                if (last && t < ahead_ctx) prefetch_row(cursor_next(ahead), ahead->row);
                const char *row = cursor_next(&cursor) + h * head_bytes;
                for (int64_t i = 0; i < cols; i++) {
                    const vec8 v = kv_load8(row, first + i, half);
                    for (int64_t g = 0; g < group; g++)
                        sums[g * cols + i] = fma8(v, p[g * ctx + t] + (vec8){0}, sums[g * cols + i]);
                }
            }
            for (int64_t g = 0; g < group; g++)
                for (int64_t i = 0; i < cols; i++) acc[(h * group + g) * chunks + first + i] = sums[g * cols + i];
        }
}
#endif

/* acc = probs @ V: by kv head in registers where its query heads' accumulators fit, by strips of columns where
 * the heads are wide (head_dim 256: on (8 query / 2 kv, head_dim 128) strips had been 27 % slower than
 * values_all_heads), else all heads at once. */
INLINE void sequence_values(const DecodeShape *s, const void *v_layer, const int32_t *table, int64_t ctx,
                            int64_t group, int64_t chunks, const float *probs, vec8 *acc, RowCursor *ahead,
                            int64_t ahead_ctx, int half) {
#if defined(SIMD_NEON)
    if (group * chunks <= REGISTER_SUMS) {
        values_by_head(s, v_layer, table, ctx, group, chunks, probs, acc, ahead, ahead_ctx, half);
        return;
    }
#else
    const int64_t cols = group * chunks <= REGISTER_SUMS ? chunks : chunks >= 32 ? column_strip(group, chunks) : 0;
    if (cols) {
        values_by_columns(s, v_layer, table, ctx, group, chunks, cols, probs, acc, ahead, ahead_ctx, half);
        return;
    }
#endif
    values_all_heads(s, v_layer, table, ctx, group, chunks, probs, acc, ahead, ahead_ctx, half);
}

/* Per-thread scratch: scores (heads * max_ctx), 1/sums (heads), the query and the accumulators as vectors;
 * and the sequence this thread takes next, whose keys it prefetches (ahead_ctx 0: none). */
typedef struct {
    float *scores, *inv_sums;
    vec8 *q, *acc;
    const void *ahead_keys;
    const int32_t *ahead_table;
    int64_t ahead_skip, ahead_ctx;
} Scratch;

static int scratch_alloc(Scratch *w, int64_t heads, int64_t head_dim, int64_t max_ctx) {
    w->scores = malloc(sizeof(float) * (size_t)(heads * max_ctx + heads));
    w->q = malloc(sizeof(float) * (size_t)(2 * heads * head_dim));
    w->inv_sums = w->scores ? w->scores + heads * max_ctx : NULL;
    w->acc = w->q ? w->q + heads * head_dim / LANES : NULL;
    w->ahead_keys = NULL, w->ahead_table = NULL, w->ahead_skip = 0, w->ahead_ctx = 0;
    return w->scores != NULL && w->q != NULL;
}

static void scratch_free(Scratch *w) {
    free(w->scores);
    free(w->q);
}

/* One sequence's attention, with the group size, head_dim / 8 and the cache's element type as (ideally
 * constant) arguments. */
INLINE void attend_core(const DecodeShape *s, const void *k_layer, const void *v_layer, const int32_t *table,
                        int64_t ctx, int64_t group, int64_t chunks, int half, Scratch *w) {
    RowCursor ahead = cursor_at(s, w->ahead_keys, w->ahead_table, w->ahead_skip, w->ahead_ctx, 0, half);
    sequence_scores(s, w->q, k_layer, table, ctx, group, chunks, w->scores, v_layer, half);
    softmax_rows(w->scores, kv_first(s) * group, kv_end(s) * group, ctx, w->inv_sums);
    sequence_values(s, v_layer, table, ctx, group, chunks, w->scores, w->acc, &ahead, w->ahead_ctx, half);
}

/* Copies of attend_core for common GQA group sizes and head dims 64, 128 and 256, for each element type; anything
 * else runs generic. */
static void attend_dispatch(const DecodeShape *s, const void *k_layer, const void *v_layer, const int32_t *table,
                            int64_t ctx, Scratch *w) {
    const int64_t group = s->heads / s->kv_heads, chunks = s->head_dim / LANES;
#define SPECIALISE(G, C)                                                                                        \
    if (group == G && chunks == C)                                                                              \
        return s->kv_half ? attend_core(s, k_layer, v_layer, table, ctx, G, C, 1, w)                            \
                          : attend_core(s, k_layer, v_layer, table, ctx, G, C, 0, w);
    SPECIALISE(1, 8) SPECIALISE(2, 8) SPECIALISE(3, 8) SPECIALISE(4, 8) SPECIALISE(8, 8)
    SPECIALISE(1, 16) SPECIALISE(2, 16) SPECIALISE(4, 16) SPECIALISE(8, 16)
    SPECIALISE(2, 32) SPECIALISE(4, 32) /* Gemma 3: head_dim 256, 2 or 4 query heads a kv head */
#undef SPECIALISE
    attend_core(s, k_layer, v_layer, table, ctx, group, chunks, s->kv_half != 0, w);
}

/* Prefetches the whole first block of a sequence's K rows (up to ctx of them): the hardware prefetcher
 * has nothing to go on at a sequence's start, and each start would otherwise wait on memory line by line. */
static void prefetch_first_block(const DecodeShape *s, const void *layer, const int32_t *table, int64_t ctx) {
    const int64_t left = s->block_size - s->skip, rows = ctx < left ? ctx : left, row = row_bytes(s, (int)s->kv_half);
    const char *first = (const char *)layer + ((int64_t)table[0] * s->block_size + s->skip) * row;
    for (int64_t byte = 0; byte < rows * row; byte += 64) __builtin_prefetch(first + byte, 0, PREFETCH_LOCALITY);
}

/* The first position a query at `position` sees through a window (0: all of them). */
static inline int64_t window_first(int64_t position, int64_t window) {
    return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

typedef struct { /* the rows a decode query attends: from row `skip` of table[0], ctx of them */
    const int32_t *table;
    int64_t skip, ctx;
} Span;

/* The span of a query attending to a sequence of ctx positions (itself the last) through s's window. */
static inline Span window_span(const DecodeShape *s, const int32_t *table, int64_t ctx) {
    const int64_t first = ctx > 0 ? window_first(ctx - 1, s->window) : 0;
    return (Span){table + first / s->block_size, first % s->block_size, ctx - first};
}

static void attend_sequence(const DecodeShape *shape, const float *q, const void *k_layer, const void *v_layer,
                            const int32_t *whole_table, int64_t whole_ctx, float *out, Scratch *w) {
    const int64_t width = shape->heads * shape->head_dim;
    if (whole_ctx <= 0) {
        for (int64_t i = 0; i < width; i++) out[i] = 0.0f;
        return;
    }
    const Span span = window_span(shape, whole_table, whole_ctx);
    DecodeShape windowed = *shape;
    windowed.skip = span.skip;
    const DecodeShape *s = &windowed;
    const int32_t *table = span.table;
    const int64_t ctx = span.ctx;
    prefetch_first_block(s, k_layer, table, ctx); /* the values are prefetched with the keys */
    /* q in and the output out a vector at a time: element by element they took 3 % of a batch-64 attention */
    for (int64_t c = 0; c < width / LANES; c++) w->q[c] = *(const vec8 *)(q + c * LANES);
    attend_dispatch(s, k_layer, v_layer, table, ctx, w);
    const int64_t group = s->heads / s->kv_heads, chunks = s->head_dim / LANES;
    for (int64_t h = kv_first(s) * group; h < kv_end(s) * group; h++)
        for (int64_t c = h * chunks; c < (h + 1) * chunks; c++)
            *(vec8 *)(out + c * LANES) = w->acc[c] * w->inv_sums[h];
}

/* The next row from a counter shared by the team: dynamic scheduling, which the threads' differing sequence
 * lengths need, but done by hand so that a thread knows its next row one ahead. */
static int64_t claim_row(int64_t *counter) {
    int64_t row;
#pragma omp atomic capture
    row = (*counter)++;
    return row;
}

static inline int64_t row_of(const int64_t *which, int64_t i) { return which != NULL ? which[i] : i; }

/* Attention for work claimed from `counter` (0 at the start) until all `rows` are done: row r (which[i] for
 * the i-th; which NULL: i) has its query at q + r * q_stride, its block table at tables + r * s->table_stride,
 * its context lens[r], its output at out + r * out_stride. Each row is `split` pieces of work, each piece some
 * of its kv heads (1: whole rows): a step of fewer rows than threads splits them so that no thread idles
 * (batch 1: one thread attended while the other waited at the barrier). While one row runs, the keys of the
 * thread's next one are prefetched. */
static void attend_claimed(const DecodeShape *s, const float *q, int64_t q_stride, const void *k_layer,
                           const void *v_layer, const int32_t *tables, const int32_t *lens, float *out,
                           int64_t out_stride, int64_t rows, const int64_t *which, int64_t split, int64_t *counter,
                           Scratch *w) {
    int64_t next = claim_row(counter);
    while (next < rows * split) {
        const int64_t index = next / split, r = row_of(which, index), part = next % split;
        next = claim_row(counter);
        const int64_t ahead = next < rows * split && next / split != index ? row_of(which, next / split) : -1;
        const Span next_span = ahead >= 0 ? window_span(s, tables + ahead * s->table_stride, lens[ahead])
                                          : (Span){NULL, 0, 0};
        w->ahead_keys = k_layer;
        w->ahead_table = next_span.table, w->ahead_skip = next_span.skip, w->ahead_ctx = next_span.ctx;
        DecodeShape piece = *s;
        piece.kv_first = part * s->kv_heads / split;
        piece.kv_count = (part + 1) * s->kv_heads / split - piece.kv_first;
        attend_sequence(&piece, q + r * q_stride, k_layer, v_layer, tables + r * s->table_stride, lens[r],
                        out + r * out_stride, w);
    }
}

/* How many pieces each of `rows` rows is split into for `threads` threads (attend_claimed). */
static inline int64_t attention_split(int64_t rows, int64_t threads, int64_t kv_heads) {
    if (rows >= threads) return 1;
    const int64_t want = (threads + rows - 1) / rows;
    return want < kv_heads ? want : kv_heads;
}

/* 1 when the blocks holding positions first .. ctx - 1 of a sequence (those its attention reads: first > 0 for a
 * sliding layer, from its window's first position) all lie in the cache. The blocks before may be anything: a
 * sliding layer's own pool marks those it gave back with -1. */
static int table_in_cache(const int32_t *table, int64_t first, int64_t ctx, int64_t block_size, int64_t num_blocks) {
    for (int64_t b = first / block_size; b < (ctx + block_size - 1) / block_size; b++)
        if (table[b] < 0 || table[b] >= num_blocks) return 0;
    return 1;
}

/* Validates the context lengths: -3 if one is outside 1..table_stride * block_size; else their maximum. */
static int64_t max_context(const int32_t *context_lens, int64_t batch, int64_t max_len, int64_t *total) {
    int64_t top = 1;
    *total = 0;
    for (int64_t b = 0; b < batch; b++) {
        if (context_lens[b] < 1 || context_lens[b] > max_len) return -3;
        top = context_lens[b] > top ? context_lens[b] : top;
        *total += context_lens[b];
    }
    return top;
}

#endif
