/* Prefill attention for one sequence's chunk, for the NumPy backend on the CPU: the chunk's n query tokens are
 * the last n of the sequence's context_len positions (their K and V already stored), and each attends to the
 * positions up to its own.
 *
 * Per kv head, the sequence's keys and values are first gathered from their scattered blocks into contiguous
 * (context, head_dim) float32 buffers (widened from a float16 cache). Then each tile of CHUNK_TILE query tokens
 * (times the group's query heads: 48 query rows for SmolLM2) is two small matmuls: the scores S = Q K^T by the
 * projection loop of matmul.h, and the output O = P V by register blocks of 3 rows x 32 columns (x 8 when head_dim
 * is not a multiple of 32), so that each key or value loaded serves several query rows. A tile reads only the keys
 * its last token sees (rounded up to 8). Running the chunk's tokens as rows of the decode kernel instead read the
 * whole context once per token.
 *
 * A sliding layer's chunk (window > 0) gathers only the positions from its first query's window on, and each tile
 * reads the keys from its first token's window start (rounded down to 8) to its last token; each row's softmax
 * runs over its own window.
 *
 * The reference is attention.prefill_attention (NumPy: a masked score matrix per head and BLAS matmuls).
 */
#ifndef PAGEDSERVE_CHUNK_ATTENTION_H
#define PAGEDSERVE_CHUNK_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "matmul.h"

#define CHUNK_TILE 16 /* query tokens per tile */
#define OUT_ROWS 3    /* query rows per register block of O = P V */

typedef struct {
    int64_t n, context, heads, kv_heads, head_dim, group;
    int64_t padded; /* context - base rounded up to 8: the key and value buffers' rows, zero past context */
    float scale;
    int64_t q_stride; /* floats from one token's queries to the next's (heads * head_dim when packed) */
    int64_t kv_half;  /* 1: the cache holds float16, 0: float32 */
    int64_t window;   /* a query at position p sees p - window + 1 .. p; 0: every position up to p */
    int64_t base;     /* the first position gathered: the chunk's first query's window start */
} ChunkShape;

static int64_t round_up8(int64_t x) { return (x + LANES - 1) / LANES * LANES; }

/* The shape of a chunk of n queries, the last of `context` positions, attending through `window`. */
static ChunkShape chunk_geometry(int64_t n, int64_t context, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 float scale, int64_t q_stride, int64_t kv_half, int64_t window) {
    const int64_t base = window_first(context - n, window);
    return (ChunkShape){n, context, heads, kv_heads, head_dim, heads / kv_heads, round_up8(context - base), scale,
                        q_stride, kv_half, window, base};
}

/* dst (n floats, a multiple of 8) = n cached values at src, float32 or float16. */
static void copy_cached(float *dst, const char *src, int64_t n, int64_t half) {
    if (half) widen_f16((const uint8_t *)src, n, dst);
    else memcpy(dst, src, sizeof(float) * (size_t)n);
}

/* keys and values (kv_heads, padded, head_dim): every kv head's rows in position order from base, zero past
 * context. */
static void gather_kv(const ChunkShape *c, const void *k_layer, const void *v_layer, const int32_t *table,
                      int64_t block_size, float *keys, float *values) {
    const int64_t value_bytes = kv_bytes((int)c->kv_half), row = c->kv_heads * c->head_dim * value_bytes;
    const int64_t bytes = (int64_t)sizeof(float) * c->head_dim;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < c->padded; t++)
        for (int64_t h = 0; h < c->kv_heads; h++) {
            float *k = keys + (h * c->padded + t) * c->head_dim, *v = values + (h * c->padded + t) * c->head_dim;
            const int64_t position = c->base + t;
            if (position >= c->context) {
                memset(k, 0, (size_t)bytes), memset(v, 0, (size_t)bytes);
                continue;
            }
            const int64_t at = ((int64_t)table[position / block_size] * block_size + position % block_size) * row
                               + h * c->head_dim * value_bytes;
            copy_cached(k, (const char *)k_layer + at, c->head_dim, c->kv_half);
            copy_cached(v, (const char *)v_layer + at, c->head_dim, c->kv_half);
        }
}

/* o[r, 0..WIDE*8) = p[r, 0..span) @ v[0..span, same columns], for `rows` (1..OUT_ROWS, a constant once inlined)
 * rows of p (row stride ldp) and one strip of WIDE vectors of v's columns (row stride ldv). */
#if defined(SIMD_NEON)
/* The NEON pairs' version (simd.h): 12 accumulator pairs, 3 broadcast weights and a column pair, in registers. */
static inline __attribute__((always_inline)) void weighted_block(const float *p, int64_t ldp, const float *v,
                                                                  int64_t ldv, int64_t span, float *o,
                                                                  int64_t ldo, int rows, int wide) {
    pair8 acc[OUT_ROWS][4];
#pragma GCC unroll 3
    for (int r = 0; r < OUT_ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[r][c] = zero_pair();
    for (int64_t t = 0; t < span; t++) {
        pair8 weight[OUT_ROWS];
#pragma GCC unroll 3
        for (int r = 0; r < rows; r++) weight[r] = broadcast_pair(p[r * ldp + t]);
#pragma GCC unroll 4
        for (int c = 0; c < wide; c++) {
            const pair8 column = load_pair(v + t * ldv + c * LANES);
#pragma GCC unroll 3
            for (int r = 0; r < rows; r++) acc[r][c] = fma_pair(weight[r], column, acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < wide; c++) store_pair(o + r * ldo + c * LANES, acc[r][c]);
}
#else
static inline __attribute__((always_inline)) void weighted_block(const float *p, int64_t ldp, const float *v,
                                                                  int64_t ldv, int64_t span, float *o,
                                                                  int64_t ldo, int rows, int wide) {
    vec8 acc[OUT_ROWS][4] = {{{0}}}, weight[OUT_ROWS] = {{0}};
    for (int64_t t = 0; t < span; t++) {
        for (int r = 0; r < rows; r++) weight[r] = (vec8){0} + p[r * ldp + t]; /* broadcast */
        for (int c = 0; c < wide; c++) {
            const vec8 column = in_register(*(const vec8 *)(v + t * ldv + c * LANES));
            for (int r = 0; r < rows; r++) acc[r][c] = fma8(weight[r], column, acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < wide; c++) __builtin_memcpy(o + r * ldo + c * LANES, &acc[r][c], sizeof(vec8));
}
#endif

/* o (rows, head_dim) = p (rows, span) @ v (span, head_dim): strips of 4 vectors (or of 1 when head_dim is not
 * a multiple of 32), blocks of OUT_ROWS rows, each with a constant row count and width. */
static void weighted_rows(const float *p, int64_t ldp, const float *v, int64_t span, int64_t head_dim, float *o,
                          int64_t rows) {
    const int wide = head_dim % (4 * LANES) == 0 ? 4 : 1;
    for (int64_t c = 0; c < head_dim; c += wide * LANES)
        for (int64_t r = 0; r < rows; r += OUT_ROWS) {
            const float *pr = p + r * ldp, *vc = v + c;
            float *out = o + r * head_dim + c;
            const int64_t left = rows - r < OUT_ROWS ? rows - r : OUT_ROWS;
#define WEIGHTED(R, W) \
    if (left == R && wide == W) weighted_block(pr, ldp, vc, head_dim, span, out, head_dim, R, W);
            WEIGHTED(3, 4) WEIGHTED(2, 4) WEIGHTED(1, 4) WEIGHTED(3, 1) WEIGHTED(2, 1) WEIGHTED(1, 1)
#undef WEIGHTED
        }
}

typedef struct { /* one thread's buffers: the tile's queries, scores and outputs, and the 1 / sums of its rows */
    float *q, *scores, *o, *inv_sums;
} ChunkScratch;

static int chunk_scratch_alloc(ChunkScratch *w, const ChunkShape *c) {
    const int64_t rows = CHUNK_TILE * c->group;
    w->q = malloc(sizeof(float) * (size_t)(rows * (2 * c->head_dim + c->padded + 1)));
    w->o = w->q ? w->q + rows * c->head_dim : NULL;
    w->scores = w->q ? w->o + rows * c->head_dim : NULL;
    w->inv_sums = w->q ? w->scores + rows * c->padded : NULL;
    return w->q != NULL;
}

/* The tile's query rows (token i, group head g) -> row i * group + g of w->q, scaled; returns the row count. */
static int64_t load_tile_queries(const ChunkShape *c, const float *q, int64_t kv_head, int64_t first,
                                 ChunkScratch *w) {
    const int64_t tokens = c->n - first < CHUNK_TILE ? c->n - first : CHUNK_TILE;
    for (int64_t i = 0; i < tokens; i++)
        for (int64_t g = 0; g < c->group; g++) {
            const float *src = q + (first + i) * c->q_stride + (kv_head * c->group + g) * c->head_dim;
            for (int64_t j = 0; j < c->head_dim; j++) w->q[(i * c->group + g) * c->head_dim + j] = src[j] * c->scale;
        }
    return tokens * c->group;
}

/* Each row's scores (row stride span, from gathered row lo) -> exp(score - max) over the positions its token
 * sees, 0 outside them. */
static void causal_softmax(const ChunkShape *c, int64_t first, int64_t rows, int64_t lo, int64_t span,
                           ChunkScratch *w) {
    const int64_t start = c->context - c->n; /* the position of the chunk's first token */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t position = start + first + r / c->group, offset = c->base + lo;
        const int64_t from = window_first(position, c->window) - offset, seen = position + 1 - offset;
        float *scores = w->scores + r * span;
        for (int64_t t = 0; t < from; t++) scores[t] = 0.0f;
        w->inv_sums[r] = 1.0f / exp_and_sum(scores + from, seen - from);
        for (int64_t t = seen; t < span; t++) scores[t] = 0.0f;
    }
}

/* Tile `tile` of the chunk for kv head h: its rows of out (n, heads, head_dim). */
static void chunk_tile(const ChunkShape *c, const float *q, int64_t h, int64_t tile, const float *keys,
                       const float *values, float *out, ChunkScratch *w) {
    const int64_t first = tile * CHUNK_TILE, rows = load_tile_queries(c, q, h, first, w);
    const int64_t start = c->context - c->n + first; /* the tile's first token's position */
    /* the gathered rows its tokens see: from its first token's window start (down to a multiple of 8, so that lo +
     * span stays within padded) up to its last token */
    const int64_t lo = (window_first(start, c->window) - c->base) / LANES * LANES;
    const int64_t span = round_up8(start + rows / c->group - c->base - lo);
    const float *k = keys + (h * c->padded + lo) * c->head_dim, *v = values + (h * c->padded + lo) * c->head_dim;
    project_rest(w->q, k, w->scores, rows, c->head_dim, span, 0, 0, 1);
    causal_softmax(c, first, rows, lo, span, w);
    weighted_rows(w->scores, span, v, span, c->head_dim, w->o, rows);
    for (int64_t r = 0; r < rows; r++) {
        float *dst = out + ((first + r / c->group) * c->heads + h * c->group + r % c->group) * c->head_dim;
        for (int64_t j = 0; j < c->head_dim; j++) dst[j] = w->o[r * c->head_dim + j] * w->inv_sums[r];
    }
}

#endif
