/* The stored-weight projections of quant_matmul.h with 16-lane accumulators, where the CPU has AVX-512.
 *
 * A block of 32 dequantized weights is two 512-bit vectors: multiplying them with x as they come saves the four
 * splits into 8-lane halves and half the FMAs per block (a batch-1 step's projections took about 15 % less
 * time). The values are still gguf's exactly; only the summation order differs from the 8-lane kernels (and so
 * from the float32 copy's), by float32 rounding. The order is the same for every path and batch size: each
 * row's dot product accumulates 16 lanes over x in order, folds the upper 8 lanes onto the lower (lane i +
 * lane i + 8) and sums those in hsum_pairs' order, so a row's result still does not depend on its batch.
 * Used for Q4_0, Q4_1, Q8_0, and float16 / bfloat16 whose rows are whole vectors of 16 (quant_wide_for); never for
 * quant_k.h's types, which every tier sums in 8 lanes (the path this file's tiers share with the avx2 tier).
 */
#ifndef PAGEDSERVE_QUANT_WIDE_H
#define PAGEDSERVE_QUANT_WIDE_H

#include "matmul.h"
#include "quant.h"

/* The prefetches of stored weight rows `row` .. row + rows - 1 (fewer at the end of w, none past it), spread
 * over `blocks` steps of the work before them. */
static inline Ahead stored_rows_ahead(const Weights *w, int64_t n, int64_t row, int64_t rows, int64_t blocks) {
    const int64_t count = n - row < rows ? n - row : rows;
    return ahead_bytes(weights_row(w, count > 0 ? row : 0), count > 0 ? count * w->row_bytes : 0, blocks);
}

/* The prefetches of tile t's successor (the next TILE weight rows), spread over the tile's `blocks` blocks: a
 * block of each row at a time is a pattern the hardware prefetcher does not follow. */
static inline Ahead next_tile_ahead(const Weights *w, int64_t n, int64_t t, int64_t blocks) {
    return stored_rows_ahead(w, n, (t + 1) * TILE, TILE, blocks);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define QUANT_WIDE 1
#include <immintrin.h>

/* Not for Q2_K / Q3_K (is_k23): every caller sends them elsewhere first (quant_k.h's eight_lanes_tiled). */
static inline int quant_wide_for(int32_t type, int64_t k) {
    return type != WEIGHTS_F32 && !eight_lanes_tiled(type) && k % 16 == 0;
}

/* 8 lanes from 16: lane i + lane i + 8 (the fold every path applies before hsum_pairs' order). */
static inline vec8 fold16(__m512 v) {
    return (vec8)_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

/* A tile's dot products into y (+= with `add`): each of `pair` rows' TILE accumulators folded to 8 lanes and
 * summed in hsum8's order, as every 16-lane path sums a row. */
static inline __attribute__((always_inline)) void store_tile_dots(const __m512 *acc0, const __m512 *acc1,
                                                                  float *y, int64_t pair, int64_t n, int64_t t,
                                                                  int add) {
    for (int64_t i = 0; i < pair; i++) {
        vec8 folded[TILE];
        for (int j = 0; j < TILE; j++) folded[j] = fold16(i == 0 ? acc0[j] : acc1[j]);
        vec8 dots = hsum8(folded);
        float *out = y + i * n + t * TILE;
        if (add) dots += *(const vec8 *)out;
        __builtin_memcpy(out, &dots, sizeof dots);
    }
}

/* Weights 16 * c .. 16 * c + 15 of a float16 or bfloat16 row. */
static inline __m512 deq16_float(const uint8_t *row, int32_t type, int64_t c) {
    const __m256i halves = _mm256_loadu_si256((const __m256i *)(row + 32 * c));
    if (type == WEIGHTS_F16) return _mm512_cvtph_ps(halves);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

/* Block b (32 weights) as two vectors; `type` a constant where inlined. Q4: the 16-value table of deq_q4.
 * quant_k.h's types (which no 16-lane path reads: DISPATCH_TYPE only instantiates them) by deq_block. */
static inline __attribute__((always_inline)) void deq_block16(const uint8_t *row, int32_t type, int64_t b,
                                                             __m512 out[2]) {
    if (type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1) {
        const int with_min = type == WEIGHTS_Q4_1;
        const uint8_t *block = row + b * (with_min ? 20 : 18);
        uint32_t halves;
        memcpy(&halves, block, sizeof halves);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)halves));
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 table = _mm512_mul_ps(with_min ? iota : _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)),
                                     _mm512_broadcastss_ps(dm));
        if (with_min) {
            __asm__("" : "+v"(table)); /* two roundings, as gguf */
            table = _mm512_add_ps(table, _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
        }
        const __m128i q = _mm_loadu_si128((const __m128i *)(block + (with_min ? 4 : 2))), low = _mm_set1_epi8(0x0f);
        out[0] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low)), table);
        out[1] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low)), table);
    } else if (type == WEIGHTS_Q8_0) {
        const uint8_t *block = row + b * 34;
        const __m512 d = _mm512_set1_ps(half_to_float(load_u16(block)));
        out[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 2)))), d);
        out[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 18)))), d);
    } else if (eight_lanes_only(type)) {
        vec8 v[4];
        KScales ks;
        if (is_k_quant(type)) k_scales_of(row, type, b / 8, &ks);
        deq_block(row, type, b, &ks, v);
        for (int h = 0; h < 2; h++)
            out[h] = _mm512_insertf32x8(_mm512_castps256_ps512((__m256)v[2 * h]), (__m256)v[2 * h + 1], 1);
    } else {
        out[0] = deq16_float(row, type, 2 * b), out[1] = deq16_float(row, type, 2 * b + 1);
    }
}

/* The float types' last 16 weights when k % 32 == 16 (never for the quantized types). */
static inline __attribute__((always_inline)) __m512 deq_tail16(const uint8_t *row, int32_t type, int64_t k) {
    return deq16_float(row, type, k / 16 - 1);
}

/* Tile t (8 weight rows) for `pair` (1 or 2) rows of x; `type` a constant (DISPATCH_TYPE). */
static inline __attribute__((always_inline)) void tile_pair_wide_t(const float *x, const Weights *w, float *y,
                                                                   int64_t pair, int64_t k, int64_t n, int64_t t,
                                                                   int add, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const float *x1 = x + (pair > 1 ? k : 0);
    __m512 acc0[TILE], acc1[TILE];
    for (int j = 0; j < TILE; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    Ahead ahead = next_tile_ahead(w, n, t, blocks);
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        const __m512 a0 = _mm512_loadu_ps(x + 32 * b), a1 = _mm512_loadu_ps(x + 32 * b + 16);
        const __m512 b0 = _mm512_loadu_ps(x1 + 32 * b), b1 = _mm512_loadu_ps(x1 + 32 * b + 16);
        for (int j = 0; j < TILE; j++) {
            __m512 v[2];
            deq_block16(weights_row(w, t * TILE + j), type, b, v);
            acc0[j] = _mm512_fmadd_ps(a1, v[1], _mm512_fmadd_ps(a0, v[0], acc0[j]));
            if (pair > 1) acc1[j] = _mm512_fmadd_ps(b1, v[1], _mm512_fmadd_ps(b0, v[0], acc1[j]));
        }
    }
    if (k % QBLOCK)
        for (int j = 0; j < TILE; j++) {
            const __m512 v = deq_tail16(weights_row(w, t * TILE + j), type, k);
            acc0[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k - 16), v, acc0[j]);
            if (pair > 1) acc1[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + k - 16), v, acc1[j]);
        }
    store_tile_dots(acc0, acc1, y, pair, n, t, add);
}

static void project_tile_wide(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                              int64_t t, int add) {
    for (int64_t i = 0; i < m; i += 2) {
        const int64_t pair = m - i < 2 ? m - i : 2;
#define TILE_PAIR_WIDE(T) tile_pair_wide_t(x + i * k, w, y + i * n, pair, k, n, t, add, T)
        DISPATCH_TYPE(w->type, TILE_PAIR_WIDE)
#undef TILE_PAIR_WIDE
    }
}

/* One weight row, dequantized in registers (tails past the last whole tile or strip). */
static inline __attribute__((always_inline)) float row_dot_wide_t(const float *x, const uint8_t *row, int64_t k,
                                                                  const int32_t type) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QBLOCK; b++) {
        __m512 v[2];
        deq_block16(row, type, b, v);
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + 32 * b + 16), v[1],
                              _mm512_fmadd_ps(_mm512_loadu_ps(x + 32 * b), v[0], acc));
    }
    if (k % QBLOCK) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k - 16), deq_tail16(row, type, k), acc);
    return hsum_pairs(fold16(acc));
}

static float row_dot_wide(const float *x, const uint8_t *row, int32_t type, int64_t k) {
    float dot = 0.0f;
#define ROW_DOT_WIDE(T) dot = row_dot_wide_t(x, row, k, T)
    DISPATCH_TYPE(type, ROW_DOT_WIDE)
#undef ROW_DOT_WIDE
    return dot;
}

/* The strips' register blocks: WIDE_STRIP dequantized weight rows x up to WIDE_ROWS rows of x, 24 accumulators
 * of the 32 registers. Each x vector is loaded once and used for the block's 4 weight rows, so a step of 16 lanes
 * loads 10 vectors for 24 FMAs (the 8-lane blocks of matmul.h, 3 x 4, loaded 7 for 12: at batch 64 the
 * projections ran at about half the FMA peak). Weight rows past the last whole block of 4 go one at a time. A
 * row's sums are the tiles' in any block shape: 16 lanes in order over k, folded, summed in hsum_pairs' order. */
#define WIDE_STRIP 4
#define WIDE_ROWS 6

static inline __attribute__((always_inline)) void block_dots_wide(const float *x, int64_t k, const float *w,
                                                                  float *y, int64_t n, int rows, int strip, int add) {
    __m512 acc[WIDE_ROWS][WIDE_STRIP];
    for (int r = 0; r < WIDE_ROWS; r++)
        for (int s = 0; s < WIDE_STRIP; s++) acc[r][s] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        __m512 wv[WIDE_STRIP];
        for (int s = 0; s < strip; s++) wv[s] = _mm512_loadu_ps(w + s * k + c);
        for (int r = 0; r < rows; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * k + c);
            __asm__("" : "+v"(xv)); /* one load, not one folded into each FMA */
            for (int s = 0; s < strip; s++) acc[r][s] = _mm512_fmadd_ps(xv, wv[s], acc[r][s]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float dots[4];
        hsum4(fold16(acc[r][0]), fold16(acc[r][strip > 1]), fold16(acc[r][strip > 2 ? 2 : 0]),
              fold16(acc[r][strip > 3 ? 3 : 0]), dots);
        for (int s = 0; s < strip; s++) y[r * n + s] = add ? y[r * n + s] + dots[s] : dots[s];
    }
}

/* block_dots_wide with constant shapes: `strip` WIDE_STRIP or 1. */
static void block_dots_wide_rows(const float *x, int64_t k, const float *w, float *y, int64_t n, int64_t rows,
                                 int strip, int add) {
#define BLOCK_WIDE(R) strip == WIDE_STRIP ? block_dots_wide(x, k, w, y, n, R, WIDE_STRIP, add) \
                                          : block_dots_wide(x, k, w, y, n, R, 1, add)
    switch (rows) {
    case 6: BLOCK_WIDE(6); break;
    case 5: BLOCK_WIDE(5); break;
    case 4: BLOCK_WIDE(4); break;
    case 3: BLOCK_WIDE(3); break;
    case 2: BLOCK_WIDE(2); break;
    default: BLOCK_WIDE(1); break;
    }
#undef BLOCK_WIDE
}

/* Register blocks pass_strips_wide runs for m rows of x against `rows` weight rows (its prefetch steps). */
static inline int64_t wide_blocks(int64_t m, int64_t rows) {
    return (m + WIDE_ROWS - 1) / WIDE_ROWS * (rows / WIDE_STRIP + rows % WIDE_STRIP);
}

/* pass_strips with the wide register blocks: weight rows first .. first + rows - 1, dequantized in `strips`. */
static void pass_strips_wide(const float *x, const float *strips, float *y, int64_t m, int64_t k, int64_t n,
                             int64_t first, int64_t rows, int add, Ahead *ahead) {
    for (int64_t i = 0; i < m; i += WIDE_ROWS)
        for (int64_t s = 0; s < rows;) {
            const int strip = rows - s >= WIDE_STRIP ? WIDE_STRIP : 1;
            block_dots_wide_rows(x + i * k, k, strips + s * k, y + i * n + first + s, n,
                                 m - i < WIDE_ROWS ? m - i : WIDE_ROWS, strip, add);
            ahead_step(ahead);
            s += strip;
        }
}
#else
#define QUANT_WIDE 0
static inline int quant_wide_for(int32_t type, int64_t k) { return (void)type, (void)k, 0; }
static inline int64_t wide_blocks(int64_t m, int64_t rows) { return (void)m, (void)rows, 0; }
#endif

#endif
