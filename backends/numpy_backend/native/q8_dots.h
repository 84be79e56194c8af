/* The fast precision's small steps: y = x @ w.T for 1 .. FAST_MIN_ROWS - 1 rows of x and Q4_0 or Q4_1 weights,
 * multiplied in integers (as llama.cpp's CPU kernels do). Each row of x is rounded, per block of 32, to 8-bit
 * integers qx with one scale dx = max |x| / 127; each block's 32 products of the stored 4-bit integers qw and
 * qx are summed exactly in int32 (VNNI's vpdpbusd, or AVX2's pmaddubsw + pmaddwd), then scaled in float:
 *   Q4_1, w = dw * qw + mw:   dw * dx * sum(qw * qx) + mw * sx
 *   Q4_0, w = dw * (qw - 8):  dw * dx * sum(qw * qx) - 8 * dw * sx
 * where sx = dx * sum(qx), the block's x summed, computed once per call. The exact kernels dequantize every
 * weight to a float and multiply floats, which kept a batch-1 step's projections bound by the arithmetic at
 * half the bus's speed. Here 8 weight rows are multiplied together, one a lane (q8_group_t): a block of the 8
 * rows costs four loads and eight shuffles to transpose their bytes, eight masks, eight integer dots, and one
 * conversion and one FMA per row of x. Q8_0 (the default model's output head) stays exact: its exact kernel
 * already reads at the bus's speed, and rounding x for it too moved perplexity by 0.78 % instead of 0.55 % (with
 * the loop of that time).
 *
 * Rounding x costs accuracy, measured by bench/precision.py against the exact precision; and a row's result
 * depends on its step's size (these for small steps, the tiles of fast_matmul.h for larger ones). The
 * reference is q8_reference in matmul.py (tests/backends/test_native_fast.py).
 */
#ifndef PAGEDSERVE_Q8_DOTS_H
#define PAGEDSERVE_Q8_DOTS_H

#include <stdint.h>
#include <string.h>

#include "quant_wide.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q8_DOTS 1
#include <immintrin.h>

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

/* acc + the 8 int32 sums of 4 products each of unsigned u and signed s bytes. (pmaddubsw's int16 pairs cannot
 * saturate: qw <= 15 and |qx| <= 127.) */
static inline __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

#define Q8_GROUP 8 /* weight rows multiplied together, one a lane */

static inline int64_t q8_block_bytes(int32_t type) { return type == WEIGHTS_Q4_1 ? 20 : 18; }

/* 8 uint32 lanes (each < 65536) as 8 uint16. */
static inline __m128i low_halves(__m256i v) {
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* The weight rows first .. first + 7, past n the last row again (its lanes are computed and not stored), and
 * their distances from the first in bytes. */
typedef struct {
    const uint8_t *row[Q8_GROUP];
    __m256i offsets;
} Q8Group;

static inline Q8Group q8_group(const Weights *w, int64_t n, int64_t first) {
    Q8Group g;
    int32_t offsets[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) {
        const int64_t r = first + j < n ? first + j : n - 1;
        g.row[j] = weights_row(w, r);
        offsets[j] = (int32_t)((r - first) * w->row_bytes);
    }
    g.offsets = _mm256_loadu_si256((const __m256i *)offsets);
    return g;
}

/* Block b of the group's rows: each row's dw in d's lane j, and mw in m's (mw = -8 dw for Q4_0), from the
 * block's first four bytes, gathered. */
static inline __attribute__((always_inline)) void q8_group_scales(const Q8Group *g, int64_t b, __m256 *d,
                                                                 __m256 *m, const int32_t type) {
    const __m256i pairs = _mm256_i32gather_epi32((const int *)(g->row[0] + b * q8_block_bytes(type)), g->offsets, 1);
    *d = _mm256_cvtph_ps(low_halves(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff))));
    *m = type == WEIGHTS_Q4_1 ? _mm256_cvtph_ps(low_halves(_mm256_srli_epi32(pairs, 16)))
                              : _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
}

/* Block b of the group's rows, transposed: lane j of lo[c] holds row j's weights 4c .. 4c + 3 as bytes, of
 * hi[c] its weights 4c + 16 .. 4c + 19 (a block's byte i holds weight i low and weight i + 16 high). Rows j and
 * j + 4 share a load; a 4 x 4 transpose of 32-bit words in each half puts word c of every row in one vector. */
static inline __attribute__((always_inline)) void q8_group_weights(const Q8Group *g, int64_t b, __m256i lo[4],
                                                                  __m256i hi[4], const int32_t type) {
    const int64_t at = b * q8_block_bytes(type) + (type == WEIGHTS_Q4_1 ? 4 : 2);
    __m256i p[4];
    for (int j = 0; j < 4; j++)
        p[j] = _mm256_loadu2_m128i((const __m128i *)(g->row[j + 4] + at), (const __m128i *)(g->row[j] + at));
    const __m256i t0 = _mm256_unpacklo_epi32(p[0], p[1]), t1 = _mm256_unpackhi_epi32(p[0], p[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(p[2], p[3]), t3 = _mm256_unpackhi_epi32(p[2], p[3]);
    const __m256i words[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        lo[c] = _mm256_and_si256(words[c], nibble);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(words[c], 4), nibble);
    }
}

/* Four bytes of x broadcast to every lane. */
static inline __m256i q8_x_word(const int8_t *q) {
    int32_t word;
    memcpy(&word, q, sizeof word);
    return _mm256_set1_epi32(word);
}

/* The integer dot product of block b of row i of x with the group's rows, one lane a row: two chains of four. */
static inline __attribute__((always_inline)) __m256i q8_group_dots(const __m256i lo[4], const __m256i hi[4],
                                                                  const int8_t *qx) {
    __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        even = dot_u8s8_add(even, lo[c], q8_x_word(qx + 4 * c));
        odd = dot_u8s8_add(odd, hi[c], q8_x_word(qx + 16 + 4 * c));
    }
    return _mm256_add_epi32(even, odd);
}

/* y[i, first + j] (+)= row i of x . weight row first + j, for `rows` (1..3) rows of x and the group of 8 weight
 * rows from `first` (fewer past n), `rows` and `type` constants once inlined. Lane j of each vector is weight
 * row j, so a block costs one conversion and one FMA per row of x for all 8 rows, where a row a vector (the
 * lanes its block's partial sums) paid both for each row: a batch-1 projection read 1.5x as many bytes a second
 * from L2 (bench/projection_rate.py). The group after the next is prefetched into L2, a few lines a block. */
static inline __attribute__((always_inline)) void q8_group_t(const Q8Rows *x, const Weights *w, float *y, int64_t k,
                                                            int64_t n, int64_t first, int add, const int rows,
                                                            const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const Q8Group g = q8_group(w, n, first);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    __m256 acc[3], mins[3];
    for (int i = 0; i < rows; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        __m256 d, m;
        __m256i lo[4], hi[4];
        q8_group_scales(&g, b, &d, &m, type);
        q8_group_weights(&g, b, lo, hi, type);
        for (int i = 0; i < rows; i++) {
            const int64_t at = i * blocks + b;
            const __m256 dots = _mm256_cvtepi32_ps(q8_group_dots(lo, hi, x->q + at * QBLOCK));
            acc[i] = _mm256_fmadd_ps(dots, _mm256_mul_ps(d, _mm256_set1_ps(x->d[at])), acc[i]);
            mins[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(x->s[at]), mins[i]);
        }
    }
    const int64_t valid = n - first < Q8_GROUP ? n - first : Q8_GROUP;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i = 0; i < rows; i++) {
        float *out = y + i * n + first;
        __m256 v = _mm256_add_ps(acc[i], mins[i]);
        if (add) v = _mm256_add_ps(v, _mm256_maskload_ps(out, mask));
        _mm256_maskstore_ps(out, mask, v);
    }
}

/* One group for every row of x (1..3), the count and the type constants. */
static void q8_group_of(const Q8Rows *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int64_t first,
                        int add) {
#define Q8_GROUP_ROWS(T)                                                                                            \
    switch (m) {                                                                                                    \
    case 3: q8_group_t(x, w, y, k, n, first, add, 3, T); break;                                                     \
    case 2: q8_group_t(x, w, y, k, n, first, add, 2, T); break;                                                     \
    default: q8_group_t(x, w, y, k, n, first, add, 1, T); break;                                                    \
    }
    if (w->type == WEIGHTS_Q4_1) {
        Q8_GROUP_ROWS(WEIGHTS_Q4_1)
    } else {
        Q8_GROUP_ROWS(WEIGHTS_Q4_0)
    }
#undef Q8_GROUP_ROWS
}

/* y (m, n) (+)= x (m, k) @ w.T for m < 4 rows and q8_reads(w->type), shared among the threads of the enclosing
 * OpenMP region as project_weights; `mine`: this thread's q8_x_bytes(m, k), where it rounds x itself (a few
 * thousand values: cheaper than a barrier). */
static void project_q8(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                       void *mine) {
    const Q8Rows rows = q8_rows_in(mine, m, k);
    q8_quantize(x, m, k, &rows);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (n + Q8_GROUP - 1) / Q8_GROUP; t++) q8_group_of(&rows, w, y, m, k, n, t * Q8_GROUP, add);
}
#else
#define Q8_DOTS 0
static inline int q8_reads(int32_t type) { return (void)type, 0; }
static inline int64_t q8_x_bytes(int64_t m, int64_t k) { return (void)m, (void)k, 0; }
#endif

#endif
