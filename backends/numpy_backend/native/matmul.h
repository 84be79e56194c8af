/* y = x @ w.T for the few rows of a decode step: the tile loop shared by the standalone projection kernel
 * (matmul_rows.c) and the fused step (fused_step.c).
 *
 * x: (m, k) activations, m small (one row per decoding sequence); w: (n, k) a weight matrix as stored, rows
 * contiguous; y: (m, n). A decode step is bound by reading the weights once, so w is streamed exactly once:
 * each tile of 8 weight rows is read from memory and then used, from cache, for every row of x. BLAS GEMM
 * instead packs w into panels first; for m between 2 and ~16 that copy costs more than the arithmetic
 * (OpenBLAS 0.3.31 here: m = 2 took 2.4x as long as m = 1).
 */
#ifndef PAGEDSERVE_MATMUL_H
#define PAGEDSERVE_MATMUL_H

#include <stdint.h>

#include "simd.h"

#define TILE 8 /* weight rows per tile: 8 accumulators, one 8-way horizontal sum */

/* The dot products of one row of x with a tile of TILE weight rows: TILE independent FMA chains. */
#if defined(SIMD_NEON)
/* The same chains and sums, the accumulators as NEON pairs (simd.h): 16 registers of 32. */
static inline __attribute__((always_inline)) vec8 tile_dots(const vec8 *x, const vec8 *w, int64_t chunks) {
    pair8 acc[TILE];
#pragma GCC unroll 8
    for (int j = 0; j < TILE; j++) acc[j] = zero_pair();
    for (int64_t c = 0; c < chunks; c++) {
        const pair8 xv = load_pair(x + c);
#pragma GCC unroll 8
        for (int j = 0; j < TILE; j++) acc[j] = fma_pair(xv, load_pair(w + j * chunks + c), acc[j]);
    }
    return hsum8_pairs(acc);
}
#else
static inline __attribute__((always_inline)) vec8 tile_dots(const vec8 *x, const vec8 *w, int64_t chunks) {
    vec8 acc[TILE];
    for (int j = 0; j < TILE; j++) acc[j] = (vec8){0};
    for (int64_t c = 0; c < chunks; c++)
        for (int j = 0; j < TILE; j++) acc[j] = fma8(x[c], w[j * chunks + c], acc[j]);
    return hsum8(acc);
}
#endif

/* One weight row (those past the last whole tile or strip): one FMA chain, summed as tile_dots and block_dots
 * sum theirs, so every path gives a row of x the same result. Slow (the chain's latency), and only for tails. */
#if defined(SIMD_NEON)
static float row_dot(const vec8 *x, const vec8 *w, int64_t chunks) {
    pair8 acc = zero_pair();
    for (int64_t c = 0; c < chunks; c++) acc = fma_pair(load_pair(x + c), load_pair(w + c), acc);
    return hsum_pair(acc);
}
#else
static float row_dot(const vec8 *x, const vec8 *w, int64_t chunks) {
    vec8 acc = {0};
    for (int64_t c = 0; c < chunks; c++) acc = fma8(x[c], w[c], acc);
    return hsum_pairs(acc);
}
#endif

/* Tile t (TILE weight rows from row t * TILE) for every row of x; `add`: y += instead of y =. */
static void project_tile(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n, int64_t t,
                         int add) {
    const int64_t chunks = k / LANES;
    const vec8 *tile = (const vec8 *)(w + t * TILE * k);
    for (int64_t i = 0; i < m; i++) {
        vec8 dots = tile_dots((const vec8 *)(x + i * k), tile, chunks);
        float *out = y + i * n + t * TILE;
        if (add) dots += *(const vec8 *)out;
        __builtin_memcpy(out, &dots, sizeof dots);
    }
}

/* From 3 rows of x up, a step is bound by the arithmetic, not by reading w: register blocks of 3 weight rows x
 * 4 rows of x (12 accumulators) need 7 loads for 12 FMAs, where a tile of 8 weight rows x 1 row needs 9 for 8
 * and so waits on loads. A strip of 3 weight rows stays in L1 while every row of x passes it (from L2). */
#define STRIP 3  /* weight rows per strip */
#define BLOCK_ROWS 4 /* rows of x per register block */
#define GROUP 8 /* strips shared out together, and passed by each register block of x in turn */
#define MIN_BLOCKED_ROWS 3 /* below this, 8-row tiles: 3 x 1 or 3 x 2 accumulators are too few FMA chains */

/* v, loaded into a register: keeps GCC from folding the load into every FMA that uses v (one load each). */
static inline __attribute__((always_inline)) vec8 in_register(vec8 v) {
#if defined(__AVX__)
    __asm__("" : "+x"(v));
#endif
    return v;
}

#if defined(SIMD_NEON)
/* block_dots below with NEON pairs (simd.h): 12 accumulator pairs, 3 weight pairs and an x pair are the 32
 * registers. The same FMAs in the same order, and hsum4's sums. */
static inline __attribute__((always_inline)) void block_dots(const float *x, int64_t k, const float *w, float *y,
                                                             int64_t n, int rows, int add) {
    const int64_t chunks = k / LANES;
    pair8 acc[BLOCK_ROWS * STRIP]; /* one dimension: GCC kept a two-dimensional array of pairs in memory */
#pragma GCC unroll 12
    for (int a = 0; a < BLOCK_ROWS * STRIP; a++) acc[a] = zero_pair();
    for (int64_t c = 0; c < chunks; c++) {
        pair8 wv[STRIP];
#pragma GCC unroll 3
        for (int s = 0; s < STRIP; s++) wv[s] = load_pair(w + (s * chunks + c) * LANES);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) { /* rows past `rows` are never read, their addresses never formed */
            const pair8 xv = load_pair(x + r * k + c * LANES);
#pragma GCC unroll 3
            for (int s = 0; s < STRIP; s++) acc[r * STRIP + s] = fma_pair(xv, wv[s], acc[r * STRIP + s]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        float dots[4];
        vst1q_f32(dots, hsum4_pairs(acc[r * STRIP], acc[r * STRIP + 1], acc[r * STRIP + 2], acc[r * STRIP + 2]));
        for (int j = 0; j < STRIP; j++) y[r * n + j] = add ? y[r * n + j] + dots[j] : dots[j];
    }
}
#else
/* y[r, 0..STRIP) (+)= x[r] . w[0..STRIP) for `rows` (1..BLOCK_ROWS, a constant once inlined) rows of x. Each
 * x vector is loaded once into a register and used for the three weight rows: 12 accumulators + 3 weight
 * vectors + 1 x vector are the 16 AVX registers (left to itself, GCC reloaded the weights and folded a load of x
 * into every FMA: 20 loads for 12 FMAs). */
static inline __attribute__((always_inline)) void block_dots(const float *x, int64_t k, const float *w, float *y,
                                                             int64_t n, int rows, int add) {
    const int64_t chunks = k / LANES;
    const vec8 *w0 = (const vec8 *)w, *w1 = w0 + chunks, *w2 = w1 + chunks;
    /* rows past `rows` are never read; their pointers are not formed (past the end of x would be UB) */
    const vec8 *x0 = (const vec8 *)x, *x1 = rows > 1 ? x0 + chunks : x0, *x2 = rows > 2 ? x0 + 2 * chunks : x0;
    const vec8 *x3 = rows > 3 ? x0 + 3 * chunks : x0;
    vec8 a0 = {0}, b0 = {0}, c0 = {0}, a1 = {0}, b1 = {0}, c1 = {0}, a2 = {0}, b2 = {0}, c2 = {0};
    vec8 a3 = {0}, b3 = {0}, c3 = {0};
    for (int64_t c = 0; c < chunks; c++) {
        const vec8 wa = in_register(w0[c]), wb = in_register(w1[c]), wc = in_register(w2[c]);
        vec8 xv = in_register(x0[c]);
        a0 = fma8(xv, wa, a0), b0 = fma8(xv, wb, b0), c0 = fma8(xv, wc, c0);
        if (rows > 1) xv = in_register(x1[c]), a1 = fma8(xv, wa, a1), b1 = fma8(xv, wb, b1), c1 = fma8(xv, wc, c1);
        if (rows > 2) xv = in_register(x2[c]), a2 = fma8(xv, wa, a2), b2 = fma8(xv, wb, b2), c2 = fma8(xv, wc, c2);
        if (rows > 3) xv = in_register(x3[c]), a3 = fma8(xv, wa, a3), b3 = fma8(xv, wb, b3), c3 = fma8(xv, wc, c3);
    }
    const vec8 sums[BLOCK_ROWS][STRIP] = {{a0, b0, c0}, {a1, b1, c1}, {a2, b2, c2}, {a3, b3, c3}};
    for (int r = 0; r < rows; r++) {
        float dots[4];
        hsum4(sums[r][0], sums[r][1], sums[r][2], sums[r][2], dots);
        for (int j = 0; j < STRIP; j++) y[r * n + j] = add ? y[r * n + j] + dots[j] : dots[j];
    }
}
#endif

/* One register block of `rows` (1..BLOCK_ROWS) rows of x against one strip, with a constant row count for
 * block_dots, so each copy keeps its accumulators in registers. */
static void block_dots_rows(const float *x, int64_t k, const float *strip, float *y, int64_t n, int64_t rows,
                            int add) {
    switch (rows) {
    case 4: block_dots(x, k, strip, y, n, 4, add); break;
    case 3: block_dots(x, k, strip, y, n, 3, add); break;
    case 2: block_dots(x, k, strip, y, n, 2, add); break;
    default: block_dots(x, k, strip, y, n, 1, add); break;
    }
}

typedef struct { /* lines of weights to prefetch, spread over the register blocks of a group */
    const char *base;
    int64_t line, lines, per_block;
} Ahead;

/* `bytes` of weights from `base` (the next group's), over `blocks` register blocks. */
static Ahead ahead_bytes(const void *base, int64_t bytes, int64_t blocks) {
    const int64_t lines = bytes / 64;
    return (Ahead){(const char *)base, 0, lines, blocks > 0 ? (lines + blocks - 1) / blocks : 0};
}

/* The weight rows from `row` (at most n) on, up to `rows` of them (fewer at the end of w), over `blocks`
 * register blocks. */
static Ahead ahead_of(const float *w, int64_t k, int64_t n, int64_t row, int64_t rows, int64_t blocks) {
    return ahead_bytes(w + row * k, (n - row < rows ? n - row : rows) * k * (int64_t)sizeof(float), blocks);
}

/* One register block's share of the prefetches. */
static inline void ahead_step(Ahead *a) {
    for (const int64_t end = a->line + a->per_block < a->lines ? a->line + a->per_block : a->lines; a->line < end;
         a->line++)
        __builtin_prefetch(a->base + a->line * 64, 0, PREFETCH_LOCALITY);
}

/* Strips first .. first + count - 1 (their weights from `strips` on, STRIP * k floats each) for every row of x:
 * each register block of x rows passes all the group's strips while it is in L1, and the group's weights
 * (GROUP strips) stay in L2 for the next block. Meanwhile the next group's weights are prefetched into L2
 * (`ahead`), a few lines after each register block. Left to the hardware prefetcher, the first block of each
 * group waited on memory, and the others computed with the bus idle: this overlap took the projections of a
 * batch-8 step from 27.5 to 17.6 ms, and of a batch-64 step from 99 to 82. (Into L1 as well, locality 3, it
 * was no faster at batch 32-64 and slower at 4-8: it evicts x.) */
static void pass_strips(const float *x, const float *strips, float *y, int64_t m, int64_t k, int64_t n,
                        int64_t first, int64_t count, int add, Ahead *ahead) {
    for (int64_t i = 0; i < m; i += BLOCK_ROWS)
        for (int64_t s = 0; s < count; s++) {
            block_dots_rows(x + i * k, k, strips + s * STRIP * k, y + i * n + (first + s) * STRIP, n,
                            m - i < BLOCK_ROWS ? m - i : BLOCK_ROWS, add);
            ahead_step(ahead);
        }
}

static void project_strips(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n,
                           int64_t first, int64_t count, int add) {
    Ahead ahead = ahead_of(w, k, n, (first + count) * STRIP, count * STRIP, (m + BLOCK_ROWS - 1) / BLOCK_ROWS * count);
    pass_strips(x, w + first * STRIP * k, y, m, k, n, first, count, add, &ahead);
}

/* The weight rows from `first` on (those past the last whole tile or group of strips): whole strips, then one
 * row at a time. */
static void project_rest(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n, int64_t first,
                         int add, int blocked) {
    if (blocked) {
        project_strips(x, w, y, m, k, n, first / STRIP, (n - first) / STRIP, add);
        first += (n - first) / STRIP * STRIP;
    }
    for (int64_t r = first; r < n; r++)
        for (int64_t i = 0; i < m; i++) {
            const float dot = row_dot((const vec8 *)(x + i * k), (const vec8 *)(w + r * k), k / LANES);
            y[i * n + r] = add ? y[i * n + r] + dot : dot;
        }
}

/* y (m, n) = x (m, k) @ w.T, or y += x @ w.T with `add`; needs k % 8 == 0. The tiles (or strips) are shared
 * among the threads of the enclosing OpenMP parallel region (an orphaned `omp for`, which ends in a barrier);
 * called outside one, a single thread does them all. (inline: the chunk kernel includes this header and does
 * not call it.) */
static inline void project_rows(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n, int add) {
    const int blocked = m >= MIN_BLOCKED_ROWS;
    const int64_t width = blocked ? STRIP * GROUP : TILE, parts = n / width;
#pragma omp for schedule(static)
    for (int64_t t = 0; t <= parts; t++) {
        if (t == parts)
            project_rest(x, w, y, m, k, n, parts * width, add, blocked);
        else if (blocked)
            project_strips(x, w, y, m, k, n, t * GROUP, GROUP, add);
        else
            project_tile(x, w, y, m, k, n, t, add);
    }
}

#endif
