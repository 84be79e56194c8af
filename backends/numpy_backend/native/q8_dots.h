/* The fast precision's small steps: y = x @ w.T for 1 .. FAST_MIN_ROWS - 1 rows of x and Q4_0 or Q4_1 weights,
 * multiplied in integers (as llama.cpp's CPU kernels do). Each row of x is rounded, per block of 32, to 8-bit
 * integers qx with one scale dx = max |x| / 127; each block's 32 products of the stored 4-bit integers qw and
 * qx are summed exactly in int32 (VNNI's vpdpbusd, or AVX2's pmaddubsw + pmaddwd), then scaled in float:
 *   Q4_1, w = dw * qw + mw:   dw * dx * sum(qw * qx) + mw * sx
 *   Q4_0, w = dw * (qw - 8):  dw * dx * sum(qw * qx) - 8 * dw * sx
 * where sx = dx * sum(qx), the block's x summed, computed once per call. The exact kernels dequantize every
 * weight to a float and multiply floats, which kept a batch-1 step's projections bound by the arithmetic at
 * half the bus's speed; here a block of 32 costs a broadcast load, a shift and a mask, one integer dot, one
 * conversion and one FMA per row of x. Q8_0 (the default model's output head) stays exact: its exact kernel
 * already reads at the bus's speed, and rounding x for it too moved perplexity by 0.78 % instead of 0.55 %.
 *
 * Rounding x costs accuracy, measured by bench/precision.py against the exact precision; and a row's result
 * depends on its step's size (these for small steps, the tiles of fast_matmul.h for larger ones). The
 * reference is q8_reference in matmul.py (tests/backends/test_native_fast.py).
 */
#ifndef PAGEDSERVE_Q8_DOTS_H
#define PAGEDSERVE_Q8_DOTS_H

#include <stdint.h>

#include "quant_wide.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q8_DOTS 1
#include <immintrin.h>

#define Q8_STRIP 4 /* weight rows per strip: with up to 3 rows of x, 12 independent FMA chains */

static inline int q8_reads(int32_t type) { return type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1; }

/* x rounded: m rows of k (k % 32 == 0) in one buffer of q8_x_bytes(m, k), laid out as below. */
typedef struct {
    int8_t *q; /* m x k: qx */
    float *d;  /* m x k / 32: each block's dx */
    float *s;  /* m x k / 32: each block's sx = dx * sum(qx) */
} Q8Rows;

static inline int64_t q8_x_bytes(int64_t m, int64_t k) { return m * k + 2 * m * (k / QBLOCK) * 4; }

static inline Q8Rows q8_rows_in(void *buffer, int64_t m, int64_t k) {
    Q8Rows r;
    r.d = (float *)buffer, r.s = r.d + m * (k / QBLOCK);
    r.q = (int8_t *)(r.s + m * (k / QBLOCK));
    return r;
}

/* Block c (32 floats at x) rounded: qx = round-to-nearest-even(x / dx), as NumPy's rint of x * (1 / dx). (A block
 * whose largest value is below ~4e-37 has a subnormal dx, whose inverse is inf: its qx are then -128 where NumPy's
 * are undefined, and its products, times dx, are below 1e-36.) */
static inline void q8_block(const float *x, int8_t *q, float *d, float *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], big = _mm256_setzero_ps();
    for (int u = 0; u < 4; u++) {
        v[u] = _mm256_loadu_ps(x + 8 * u);
        big = _mm256_max_ps(big, _mm256_andnot_ps(sign, v[u]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(big), _mm256_extractf128_ps(big, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h))), scale = amax / 127.0f;
    const __m256 inverse = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    __m256i i[4];
    for (int u = 0; u < 4; u++) i[u] = _mm256_cvtps_epi32(_mm256_mul_ps(v[u], inverse)); /* MXCSR: to even */
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    /* packs interleave the 128-bit lanes: dwords 0 4 1 5 2 6 3 7 put them back in order */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    const __m256i bytes = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, bytes);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    *d = scale, *s = scale * (float)_mm_cvtsi128_si32(t);
}

/* Every row of x rounded into r. */
static void q8_quantize(const float *x, int64_t m, int64_t k, const Q8Rows *r) {
    for (int64_t c = 0; c < m * k / QBLOCK; c++)
        q8_block(x + c * QBLOCK, r->q + c * QBLOCK, r->d + c, r->s + c);
}

/* The 8 int32 sums of 4 products each of unsigned u and signed s bytes. (pmaddubsw's int16 pairs cannot
 * saturate: qw <= 15 and |qx| <= 127.) */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

#define Q8_CHUNK 8 /* blocks whose scales a strip converts at once */

static inline int64_t q8_block_bytes(int32_t type) { return type == WEIGHTS_Q4_1 ? 20 : 18; }

/* A stored block's integers as bytes in weight order. Its byte j holds weight j low and weight j + 16 high: the
 * load broadcasts the 16 bytes to both halves and the upper half shifts by 4 (per 64-bit lane), so lane j is
 * weight j. */
static inline __attribute__((always_inline)) __m256i q8_weights(const uint8_t *row, int64_t b, const int32_t type) {
    const uint8_t *block = row + b * q8_block_bytes(type);
    const __m256i both = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(block + (type == WEIGHTS_Q4_1 ? 4 : 2))));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

/* 8 uint32 lanes (each < 65536) as 8 uint16. */
static inline __m128i low_halves(__m256i v) {
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* For `count` (1..Q8_CHUNK) blocks from b0 of one weight row: dw * dx for each of `rows` rows of x into
 * scale[i], and mw * sx added to mins[i] (one vector per row of x; mw = -8 dw for Q4_0). The
 * blocks' first four bytes (dw and mw, or dw and two bytes of q) are gathered and converted together: one by
 * one, the scalar conversions and broadcasts took the vector ports from the dot products. */
static inline __attribute__((always_inline)) void q8_scales(const uint8_t *row, int64_t b0, int64_t count,
                                                           const Q8Rows *x, int64_t blocks,
                                                           float scale[][Q8_CHUNK], __m256 *mins, const int rows,
                                                           const int32_t type) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), iota);
    const __m256i offsets = _mm256_mullo_epi32(iota, _mm256_set1_epi32((int)q8_block_bytes(type)));
    const __m256i pairs = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(),
                                                      (const int *)(row + b0 * q8_block_bytes(type)), offsets,
                                                      valid, 1);
    const __m256 d = _mm256_cvtph_ps(low_halves(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff))));
    const __m256 m = type == WEIGHTS_Q4_1 ? _mm256_cvtph_ps(low_halves(_mm256_srli_epi32(pairs, 16)))
                                          : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    for (int i = 0; i < rows; i++) {
        const int64_t at = i * blocks + b0;
        _mm256_storeu_ps(scale[i], _mm256_mul_ps(d, _mm256_maskload_ps(x->d + at, valid)));
        mins[i] = _mm256_fmadd_ps(m, _mm256_maskload_ps(x->s + at, valid), mins[i]);
    }
}

/* y[i, first + j] (+)= row i of x . weight row first + j, for `rows` (1..3) rows of x and `strip` (1 or
 * Q8_STRIP) weight rows, both constants once inlined: rows x strip accumulators of the scaled dot products,
 * and as many of the min terms; `ahead` advanced a step a block, a chunk's steps before its blocks. The row
 * addresses and the prefetch cursor are locals: read through `w` and `ahead` (the cursor's int64 stores might
 * alias w->row_bytes, for all GCC knows), every block reloaded four row addresses and stored the cursor, and a
 * batch-1 projection read 25 GB/s whether its weights were in L2 or not (bench/projection_rate.py). */
static inline __attribute__((always_inline)) void q8_strip_t(const Q8Rows *x, const Weights *w, float *y,
                                                            int64_t k, int64_t n, int64_t first, int add,
                                                            Ahead *ahead, const int rows, const int strip,
                                                            const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    __m256 acc[3][Q8_STRIP], mins[Q8_STRIP][3];
    float scale[Q8_STRIP][3][Q8_CHUNK];
    const uint8_t *row[Q8_STRIP];
    Ahead prefetch = *ahead;
    for (int j = 0; j < strip; j++) row[j] = weights_row(w, first + j);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < strip; j++) acc[i][j] = mins[j][i] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < blocks; b0 += Q8_CHUNK) {
        const int64_t count = blocks - b0 < Q8_CHUNK ? blocks - b0 : Q8_CHUNK;
        for (int j = 0; j < strip; j++) q8_scales(row[j], b0, count, x, blocks, scale[j], mins[j], rows, type);
        for (int64_t b = b0; b < b0 + count; b++) ahead_step(&prefetch);
        for (int64_t b = b0; b < b0 + count; b++) {
            for (int j = 0; j < strip; j++) {
                const __m256i q = q8_weights(row[j], b, type);
                for (int i = 0; i < rows; i++) {
                    const __m256i qx = _mm256_loadu_si256((const __m256i *)(x->q + (i * blocks + b) * QBLOCK));
                    const __m256 dots = _mm256_cvtepi32_ps(dot_u8s8(q, qx));
                    acc[i][j] = _mm256_fmadd_ps(dots, _mm256_broadcast_ss(&scale[j][i][b - b0]), acc[i][j]);
                }
            }
        }
    }
    *ahead = prefetch;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < strip; j++) {
            float *out = y + i * n + first + j;
            const float dot = hsum_pairs((vec8)_mm256_add_ps(acc[i][j], mins[j][i]));
            *out = add ? *out + dot : dot;
        }
}

/* One strip (or one weight row) for every row of x, with the counts and type as constants. */
static inline __attribute__((always_inline)) void q8_strip_type(const Q8Rows *x, const Weights *w, float *y,
                                                               int64_t m, int64_t k, int64_t n, int64_t first,
                                                               int add, Ahead *ahead, const int strip,
                                                               const int32_t type) {
    switch (m) {
    case 3: q8_strip_t(x, w, y, k, n, first, add, ahead, 3, strip, type); break;
    case 2: q8_strip_t(x, w, y, k, n, first, add, ahead, 2, strip, type); break;
    default: q8_strip_t(x, w, y, k, n, first, add, ahead, 1, strip, type); break;
    }
}

/* One strip (`strip` rows from `first`: Q8_STRIP, or 1 past the last whole strip) for every row of x, while the
 * bytes of the strip after the next are prefetched into L2, a few lines a block, issued a chunk of blocks at a
 * time (one block of each of four rows at a time is a pattern the hardware prefetcher does not follow). The
 * next strip's are too close: at the bus's speed a strip of the default model's rows (1.4-3.8 KB) goes by in
 * less than a memory access takes, and the projections waited on memory. */
static void q8_strip(const Q8Rows *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int64_t first,
                     int add, int strip) {
    Ahead ahead = stored_rows_ahead(w, n, first + strip + Q8_STRIP, Q8_STRIP, k / QBLOCK);
#define Q8_STRIP_OF(T)                                                                                              \
    if (strip == Q8_STRIP) q8_strip_type(x, w, y, m, k, n, first, add, &ahead, Q8_STRIP, T);                       \
    else q8_strip_type(x, w, y, m, k, n, first, add, &ahead, 1, T)
    if (w->type == WEIGHTS_Q4_1) {
        Q8_STRIP_OF(WEIGHTS_Q4_1);
    } else {
        Q8_STRIP_OF(WEIGHTS_Q4_0);
    }
#undef Q8_STRIP_OF
}

/* y (m, n) (+)= x (m, k) @ w.T for m < 4 rows and q8_reads(w->type), shared among the threads of the enclosing
 * OpenMP region as project_weights; `mine`: this thread's q8_x_bytes(m, k), where it rounds x itself (a few
 * thousand values: cheaper than a barrier). */
static void project_q8(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                       void *mine) {
    const Q8Rows rows = q8_rows_in(mine, m, k);
    q8_quantize(x, m, k, &rows);
    const int64_t strips = n / Q8_STRIP;
#pragma omp for schedule(static)
    for (int64_t t = 0; t <= strips; t++) {
        if (t < strips) q8_strip(&rows, w, y, m, k, n, t * Q8_STRIP, add, Q8_STRIP);
        else
            for (int64_t r = strips * Q8_STRIP; r < n; r++) q8_strip(&rows, w, y, m, k, n, r, add, 1);
    }
}
#else
#define Q8_DOTS 0
static inline int q8_reads(int32_t type) { return (void)type, 0; }
static inline int64_t q8_x_bytes(int64_t m, int64_t k) { return (void)m, (void)k, 0; }
#endif

#endif
