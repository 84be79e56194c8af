/* y = x @ w.T with w as stored (quant.h): the projections of matmul.h, reading each weight from its stored bytes.
 *
 * The arithmetic is matmul.h's, on the same dequantized floats, in the same order, so a row gets the same result
 * from the stored matrix as from its float32 copy, in any batch:
 *   1-2 rows of x (1-4 on x86 without AVX-512: TILE_ROWS): tiles of 8 weight rows, each weight dequantized in
 *     registers once and used for every row of x (tile_dots' chains: one accumulator per weight row, summed in
 *     hsum8's order);
 *   more rows: each group of strips (GROUP * STRIP weight rows) is dequantized into a per-thread buffer,
 *     which every register block of x rows then passes (pass_strips), while the next group's stored bytes
 *     are prefetched into L2.
 * A batch-1 step thus reads 97 MB of the default model instead of 538 MB, and pays the dequantization once
 * per weight; a larger batch pays it once per group of strips.
 */
#ifndef PAGEDSERVE_QUANT_MATMUL_H
#define PAGEDSERVE_QUANT_MATMUL_H

#include <stdlib.h>

#include "matmul.h"
#include "quant.h"
#include "quant_wide.h"
#if QUANT_WIDE
#include "q4_nibbles.h"
#else
static inline int nibble_ordered(int32_t type) { return (void)type, 0; }
#endif

/* Rows of x a tile takes at once: NEON's registers hold two rows' accumulators (in two passes); elsewhere up to
 * four, and steps of up to four rows stay on the tiles (MIN_BLOCKED_QROWS) instead of dequantizing strips into
 * a buffer, which costs more than it saves below five rows. The AVX-512 build (QUANT_WIDE) takes two rows a
 * tile, and its steps of three and four rows stay on the tiles too: from three rows on the strips, they took
 * 1.2-1.4x as long (docs/PERFORMANCE.md, 2026-12-06). */
#if defined(SIMD_NEON)
#define TILE_ROWS 2
#define MIN_BLOCKED_QROWS MIN_BLOCKED_ROWS
#elif QUANT_WIDE
#define TILE_ROWS 2
#define MIN_BLOCKED_QROWS 5
#else
#define TILE_ROWS 4
#define MIN_BLOCKED_QROWS 5
#endif

/* Tile t (weight rows t * TILE ..) for `pair` (1..TILE_ROWS) rows of x; `type` a constant (DISPATCH_TYPE). */
#if defined(SIMD_NEON)
#define HALF_TILE 4 /* weight rows of a tile a NEON pass takes: for two rows of x, 8 accumulator pairs */

/* The NEON tile in two passes of HALF_TILE weight rows from `first` (all 8 rows' 16 accumulator pairs would be
 * every register, with none left for the weights): each pair of a weight row and a row of x accumulates the
 * same FMAs in the same order as the generic tile, and the pass's hsum4_pairs are hsum8's lanes, so the results
 * are the generic tile's. sums[i]: row i of x's 4 dot products. */
static inline __attribute__((always_inline)) void half_tile_t(const float *x, const Weights *w, int64_t pair,
                                                              int64_t k, int64_t first, Ahead *ahead,
                                                              float32x4_t sums[2], const int32_t type) {
    const int64_t blocks = k / QBLOCK, chunks = k / LANES;
    const float *x1 = x + (pair > 1 ? k : 0);
    pair8 acc0[HALF_TILE], acc1[HALF_TILE];
    KScales ks[HALF_TILE];
#pragma GCC unroll 4
    for (int j = 0; j < HALF_TILE; j++) acc0[j] = acc1[j] = zero_pair();
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(ahead);
#pragma GCC unroll 4
        for (int j = 0; j < HALF_TILE; j++) k_scales_at(weights_row(w, first + j), type, b, &ks[j]);
#pragma GCC unroll 4
        for (int j = 0; j < HALF_TILE; j++) {
            pair8 v[4];
            deq_block_pairs(weights_row(w, first + j), type, b, &ks[j], v);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                acc0[j] = fma_pair(load_pair(x + (4 * b + u) * LANES), v[u], acc0[j]);
                if (pair > 1) acc1[j] = fma_pair(load_pair(x1 + (4 * b + u) * LANES), v[u], acc1[j]);
            }
        }
    }
    for (int64_t c = blocks * 4; c < chunks; c++) /* the float types' last chunks, past whole blocks */
#pragma GCC unroll 4
        for (int j = 0; j < HALF_TILE; j++) {
            const pair8 v = deq_pair_float(weights_row(w, first + j), type, c);
            acc0[j] = fma_pair(load_pair(x + c * LANES), v, acc0[j]);
            if (pair > 1) acc1[j] = fma_pair(load_pair(x1 + c * LANES), v, acc1[j]);
        }
    sums[0] = hsum4_pairs(acc0[0], acc0[1], acc0[2], acc0[3]);
    sums[1] = hsum4_pairs(acc1[0], acc1[1], acc1[2], acc1[3]);
}

static inline __attribute__((always_inline)) void tile_pair_t(const float *x, const Weights *w, float *y,
                                                              int64_t pair, int64_t k, int64_t n, int64_t t,
                                                              int add, const int32_t type) {
    Ahead ahead = next_tile_ahead(w, n, t, 2 * (k / QBLOCK)); /* over both passes' blocks */
    float32x4_t sums[2][2]; /* [pass][row of x] */
    for (int h = 0; h < 2; h++) half_tile_t(x, w, pair, k, t * TILE + h * HALF_TILE, &ahead, sums[h], type);
    for (int64_t i = 0; i < pair; i++) {
        float *out = y + i * n + t * TILE;
        float32x4_t lo = sums[0][i], hi = sums[1][i];
        if (add) lo = vaddq_f32(lo, vld1q_f32(out)), hi = vaddq_f32(hi, vld1q_f32(out + 4));
        vst1q_f32(out, lo), vst1q_f32(out + 4, hi);
    }
}
#else
/* `rows` (1..TILE_ROWS, a constant once inlined) rows of x against tile t: each weight row's block is
 * dequantized into registers once and used by every row of x, each (row of x, weight row) pair one FMA chain in
 * the same order whatever `rows` is, so a row's result does not depend on the rows beside it. */
static inline __attribute__((always_inline)) void tile_rows_t(const float *x, const Weights *w, float *y,
                                                              const int64_t rows, int64_t k, int64_t n,
                                                              int64_t t, int add, const int32_t type) {
    const int64_t blocks = k / QBLOCK, chunks = k / LANES;
    const vec8 *xs = (const vec8 *)x;
    const int64_t kc = k / LANES; /* a row of x, in vec8 */
    vec8 acc[TILE_ROWS][TILE];
    KScales ks[TILE]; /* each row's, decoded once per super-block (K-quants) */
    for (int i = 0; i < TILE_ROWS; i++)
        for (int j = 0; j < TILE; j++) acc[i][j] = (vec8){0};
    Ahead ahead = next_tile_ahead(w, n, t, blocks);
    const int64_t step = block_step(type);
    for (int64_t b0 = 0; b0 < blocks; b0 += step)
#pragma GCC unroll 8
        for (int64_t b = b0; b < b0 + step; b++) {
            ahead_step(&ahead);
            for (int j = 0; j < TILE; j++) k_scales_at(weights_row(w, t * TILE + j), type, b, &ks[j]);
            for (int j = 0; j < TILE; j++) {
                vec8 v[4];
                deq_block(weights_row(w, t * TILE + j), type, b, &ks[j], v);
                for (int u = 0; u < 4; u++)
                    for (int i = 0; i < rows; i++) acc[i][j] = fma8(xs[i * kc + 4 * b + u], v[u], acc[i][j]);
            }
        }
    for (int64_t c = blocks * 4; c < chunks; c++) /* the float types' last chunks, past whole blocks */
        for (int j = 0; j < TILE; j++) {
            const vec8 v = deq8_float(weights_row(w, t * TILE + j), type, c);
            for (int i = 0; i < rows; i++) acc[i][j] = fma8(xs[i * kc + c], v, acc[i][j]);
        }
    for (int64_t i = 0; i < rows; i++) {
        vec8 dots = hsum8(acc[i]);
        float *out = y + i * n + t * TILE;
        if (add) dots += *(const vec8 *)out;
        __builtin_memcpy(out, &dots, sizeof dots);
    }
}

/* The 1-2 row tile (the decode step's): two named accumulator sets, which GCC keeps in registers better than
 * tile_rows_t's array for one row (a batch-1 step is 9 % slower through it on AVX2). */
static inline __attribute__((always_inline)) void tile_two_t(const float *x, const Weights *w, float *y,
                                                             int64_t pair, int64_t k, int64_t n, int64_t t,
                                                             int add, const int32_t type) {
    const int64_t blocks = k / QBLOCK, chunks = k / LANES;
    const vec8 *x0 = (const vec8 *)x, *x1 = (const vec8 *)(x + (pair > 1 ? k : 0));
    vec8 acc0[TILE], acc1[TILE];
    KScales ks[TILE]; /* each row's, decoded once per super-block (K-quants) */
    for (int j = 0; j < TILE; j++) acc0[j] = acc1[j] = (vec8){0};
    Ahead ahead = next_tile_ahead(w, n, t, blocks);
    const int64_t step = block_step(type);
    for (int64_t b0 = 0; b0 < blocks; b0 += step)
#pragma GCC unroll 8
        for (int64_t b = b0; b < b0 + step; b++) {
            ahead_step(&ahead);
            for (int j = 0; j < TILE; j++) k_scales_at(weights_row(w, t * TILE + j), type, b, &ks[j]);
            for (int j = 0; j < TILE; j++) {
                vec8 v[4];
                deq_block(weights_row(w, t * TILE + j), type, b, &ks[j], v);
                for (int u = 0; u < 4; u++) {
                    acc0[j] = fma8(x0[4 * b + u], v[u], acc0[j]);
                    if (pair > 1) acc1[j] = fma8(x1[4 * b + u], v[u], acc1[j]);
                }
            }
        }
    for (int64_t c = blocks * 4; c < chunks; c++) /* the float types' last chunks, past whole blocks */
        for (int j = 0; j < TILE; j++) {
            const vec8 v = deq8_float(weights_row(w, t * TILE + j), type, c);
            acc0[j] = fma8(x0[c], v, acc0[j]);
            if (pair > 1) acc1[j] = fma8(x1[c], v, acc1[j]);
        }
    for (int64_t i = 0; i < pair; i++) {
        vec8 dots = hsum8(i == 0 ? acc0 : acc1);
        float *out = y + i * n + t * TILE;
        if (add) dots += *(const vec8 *)out;
        __builtin_memcpy(out, &dots, sizeof dots);
    }
}

#define tile_pair_t tile_two_t

#if TILE_ROWS > 2
/* Tile t for 3 or 4 rows of x: out of line, so that the 1-2 row path's code is what it was (inlining these into
 * project_tile_q made a batch-1 step 10 % slower). */
__attribute__((noinline, aligned(HOT_ALIGN))) static void tile_more_rows(const float *x, const Weights *w, float *y,
                                                                        int64_t rows, int64_t k, int64_t n, int64_t t,
                                                                        int add) {
#define TILE_3(T) tile_rows_t(x, w, y, 3, k, n, t, add, T)
#define TILE_4(T) tile_rows_t(x, w, y, 4, k, n, t, add, T)
    if (rows == 3) {
        DISPATCH_TYPE(w->type, TILE_3)
    } else if (rows == 4) {
        DISPATCH_TYPE(w->type, TILE_4)
    } else { /* never reached: project_tile_q passes 3..TILE_ROWS rows; any other count goes a pair at a time */
        for (int64_t i = 0; i < rows; i += 2) {
            const int64_t pair = rows - i < 2 ? rows - i : 2;
#define TILE_2(T) tile_two_t(x + i * k, w, y + i * n, pair, k, n, t, add, T)
            DISPATCH_TYPE(w->type, TILE_2)
#undef TILE_2
        }
    }
#undef TILE_3
#undef TILE_4
}
#endif
#endif

/* Tile t for `rows` (1..TILE_ROWS) rows of x by the tile loops above; `type` a constant. */
static inline __attribute__((always_inline)) void tile_any_rows_t(const float *x, const Weights *w, float *y,
                                                                  int64_t rows, int64_t k, int64_t n, int64_t t,
                                                                  int add, const int32_t type) {
#if TILE_ROWS > 2
    if (rows == 3) {
        tile_rows_t(x, w, y, 3, k, n, t, add, type);
        return;
    }
    if (rows == 4) {
        tile_rows_t(x, w, y, 4, k, n, t, add, type);
        return;
    }
#endif
    tile_pair_t(x, w, y, rows, k, n, t, add, type);
}

/* Tile t of a Q2_K / Q3_K matrix for every row of x, in place of project_tile_q: out of line, and called from
 * project_weights rather than from project_tile_q, so that project_tile_q's code for the other types is what it
 * was (these two types inlined into its dispatch made a batch-1 step on Q8_0 weights 10-15 % slower; a test for
 * them at its top alone changed its register allocation throughout, and the step 2 % slower on avx2). */
__attribute__((noinline)) static void tile_k23(const float *x, const Weights *w, float *y, int64_t m, int64_t k,
                                               int64_t n, int64_t t, int add) {
    for (int64_t i = 0; i < m; i += TILE_ROWS) {
        const int64_t rows = m - i < TILE_ROWS ? m - i : TILE_ROWS;
#define TILE_ANY(T) tile_any_rows_t(x + i * k, w, y + i * n, rows, k, n, t, add, T)
        DISPATCH_K23(w->type, TILE_ANY)
#undef TILE_ANY
    }
}

/* Tile t for every row of x, TILE_ROWS rows at a time (each weight dequantized once per group of rows). */
__attribute__((aligned(HOT_ALIGN))) static void project_tile_q(const float *x, const Weights *w, float *y, int64_t m,
                                                               int64_t k, int64_t n, int64_t t, int add) {
#if QUANT_WIDE
    if (nibble_ordered(w->type)) {
        project_tile_nibbles(x, w, y, m, k, n, t, add);
        return;
    }
    if (quant_wide_for(w->type, k)) {
        project_tile_wide(x, w, y, m, k, n, t, add);
        return;
    }
#endif
#if TILE_ROWS > 2
    if (m > 2) {
        for (int64_t i = 0; i < m; i += TILE_ROWS)
            tile_more_rows(x + i * k, w, y + i * n, m - i < TILE_ROWS ? m - i : TILE_ROWS, k, n, t, add);
        return;
    }
#endif
    for (int64_t i = 0; i < m; i += 2) {
        const int64_t pair = m - i < 2 ? m - i : 2;
#define TILE_PAIR(T) tile_pair_t(x + i * k, w, y + i * n, pair, k, n, t, add, T)
        DISPATCH_TYPE(w->type, TILE_PAIR)
#undef TILE_PAIR
    }
}

/* One weight row (past the last whole tile or strip), dequantized in registers: row_dot's chain. */
#if defined(SIMD_NEON)
static inline __attribute__((always_inline)) float row_dot_t(const vec8 *x, const uint8_t *row, int64_t k,
                                                             const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    pair8 acc = zero_pair();
    KScales ks;
    for (int64_t b = 0; b < blocks; b++) {
        pair8 v[4];
        k_scales_at(row, type, b, &ks);
        deq_block_pairs(row, type, b, &ks, v);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) acc = fma_pair(load_pair(x + 4 * b + u), v[u], acc);
    }
    for (int64_t c = blocks * 4; c < k / LANES; c++) acc = fma_pair(load_pair(x + c), deq_pair_float(row, type, c), acc);
    return hsum_pair(acc);
}
#else
static inline __attribute__((always_inline)) float row_dot_t(const vec8 *x, const uint8_t *row, int64_t k,
                                                             const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    vec8 acc = {0};
    KScales ks;
    for (int64_t b = 0; b < blocks; b++) {
        vec8 v[4];
        k_scales_at(row, type, b, &ks);
        deq_block(row, type, b, &ks, v);
        for (int u = 0; u < 4; u++) acc = fma8(x[4 * b + u], v[u], acc);
    }
    for (int64_t c = blocks * 4; c < k / LANES; c++) acc = fma8(x[c], deq8_float(row, type, c), acc);
    return hsum_pairs(acc);
}
#endif

/* row_dot_q for Q2_K / Q3_K, out of line (tile_k23), in its place. */
__attribute__((noinline)) static float row_dot_k23(const vec8 *x, const uint8_t *row, int32_t type, int64_t k) {
    float dot = 0.0f;
#define ROW_DOT(T) dot = row_dot_t(x, row, k, T)
    DISPATCH_K23(type, ROW_DOT)
#undef ROW_DOT
    return dot;
}

static float row_dot_q(const vec8 *x, const uint8_t *row, int32_t type, int64_t k) {
    float dot = 0.0f;
#define ROW_DOT(T) dot = row_dot_t(x, row, k, T)
    DISPATCH_TYPE(type, ROW_DOT)
#undef ROW_DOT
    return dot;
}

/* One weight row against one row of x (in nibble order for the Q4 types where QUANT_WIDE), by the path the
 * build sums with. */
static float row_dot_any(const float *x, const uint8_t *row, int32_t type, int64_t k) {
    if (is_k23(type)) return row_dot_k23((const vec8 *)x, row, type, k);
#if QUANT_WIDE
    if (nibble_ordered(type)) return row_dot_nibbles(x, row, type == WEIGHTS_Q4_1, k);
    if (quant_wide_for(type, k)) return row_dot_wide(x, row, type, k);
#endif
    return row_dot_q((const vec8 *)x, row, type, k);
}

/* Strips first .. first + count - 1 for every row of x, dequantized into buf first (count * STRIP * k floats). */
static void project_strips_q(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                             int64_t first, int64_t count, int add, float *buf) {
    const int wide = !is_k23(w->type) && quant_wide_for(w->type, k);
    const int64_t blocks = wide ? wide_blocks(m, count * STRIP) : (m + BLOCK_ROWS - 1) / BLOCK_ROWS * count;
    Ahead ahead = stored_rows_ahead(w, n, (first + count) * STRIP, count * STRIP, blocks);
    for (int64_t r = 0; r < count * STRIP; r++) {
#if QUANT_WIDE
        if (nibble_ordered(w->type)) {
            dequantize_row_nibbles(weights_row(w, first * STRIP + r), w->type == WEIGHTS_Q4_1, k, buf + r * k);
            continue;
        }
#endif
        dequantize_any_row(weights_row(w, first * STRIP + r), w->type, k, buf + r * k);
    }
#if QUANT_WIDE
    if (wide) {
        pass_strips_wide(x, buf, y, m, k, n, first * STRIP, count * STRIP, add, &ahead);
        return;
    }
#endif
    pass_strips(x, buf, y, m, k, n, first, count, add, &ahead);
}

/* The weight rows from `first` on (past the last whole tile or group): whole strips, then one row at a time. */
static void project_rest_q(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                           int64_t first, int add, float *buf) {
    if (buf != NULL) {
        project_strips_q(x, w, y, m, k, n, first / STRIP, (n - first) / STRIP, add, buf);
        first += (n - first) / STRIP * STRIP;
    }
    for (int64_t r = first; r < n; r++)
        for (int64_t i = 0; i < m; i++) {
            const float dot = row_dot_any(x + i * k, weights_row(w, r), w->type, k);
            y[i * n + r] = add ? y[i * n + r] + dot : dot;
        }
}

/* Floats of the buffer project_weights needs from each thread for inputs k wide: a group of strips (from
 * MIN_BLOCKED_ROWS rows of x), or the rows of x in nibble order (fewer: at most 2 k). */
static inline int64_t quant_buffer_floats(int64_t k) { return k * STRIP * GROUP; }

/* x in the order project_weights reads it: itself, or its rows in nibble order (Q4 types with AVX-512). One or
 * two rows go into the thread's own buffer, no barrier; more into `shared` (m * k floats), by every thread of
 * the region together: copies per thread cost threads x m x k floats, gigabytes for a large model's long
 * prefill on many cores. */
static inline const float *x_as_read(const float *x, const Weights *w, int64_t m, int64_t k, float *mine,
                                     float *shared) {
#if QUANT_WIDE
    if (!nibble_ordered(w->type)) return x;
    if (m < MIN_BLOCKED_ROWS) {
        permute_nibble_rows(x, m, k, mine);
        return mine;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; i++) permute_nibble_rows(x + i * k, 1, k, shared + i * k);
    return shared; /* the omp for's barrier: every row is in place */
#else
    (void)w, (void)m, (void)k, (void)mine, (void)shared;
    return x;
#endif
}

/* y (m, n) = x (m, k) @ w.T (y += with `add`), w of any type quant.h reads; weights_supported(type, k) must
 * hold. Shared among the threads of the enclosing OpenMP region, as project_rows. `buf`: quant_buffer_floats(k)
 * floats of the calling thread's own, allocated once by the caller (a buffer malloc'ed per call was mmap'ed
 * and unmapped every time, and the unmapping stalled both threads): from MIN_BLOCKED_ROWS rows the thread's
 * group of strips, below them x in nibble order; `shared`: m * k floats for x in nibble order from
 * MIN_BLOCKED_ROWS rows (x_as_read). */
static inline void project_weights(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                                   int add, float *buf, float *shared) {
    if (w->type == WEIGHTS_F32) {
        project_rows(x, (const float *)w->data, y, m, k, n, add);
        return;
    }
    x = x_as_read(x, w, m, k, buf, shared);
    const int blocked = m >= MIN_BLOCKED_QROWS; /* the same on every thread: the loop's bounds must be */
    const int64_t width = blocked ? STRIP * GROUP : TILE, parts = n / width;
#pragma omp for schedule(static)
    for (int64_t t = 0; t <= parts; t++) {
        if (t == parts)
            project_rest_q(x, w, y, m, k, n, parts * width, add, blocked ? buf : NULL);
        else if (blocked)
            project_strips_q(x, w, y, m, k, n, t * GROUP, GROUP, add, buf);
        else if (is_k23(w->type))
            tile_k23(x, w, y, m, k, n, t, add);
        else
            project_tile_q(x, w, y, m, k, n, t, add);
    }
}

#endif
