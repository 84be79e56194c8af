/* The fast precision's small steps: y = x @ w.T for 1 .. FAST_MIN_ROWS - 1 rows of x (on AVX-512 builds up to
 * Q8_MAX_ROWS, fast_matmul.h) and Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 weights (the K-quants: q8_k.h, q8_k23.h),
 * multiplied in integers (as llama.cpp's CPU kernels do). Each row of x is rounded, per block of 32, to 8-bit
 * integers qx with one scale dx = max |x| / 127; each block's 32 products of the stored 4-bit (Q5: 5-bit, Q8_0:
 * 8-bit) integers qw and qx are summed exactly in int32 (VNNI's vpdpbusd, AVX2's
 * pmaddubsw + pmaddwd, or the Arm dot product extension's sdot), then scaled in float:
 *   Q4_1, Q5_1, w = dw * qw + mw:   dw * dx * sum(qw * qx) + mw * sx
 *   Q4_0, w = dw * (qw - 8):        dw * dx * sum(qw * qx) - 8 * dw * sx
 *   Q5_0, w = dw * (qw - 16):       dw * dx * sum(qw * qx) - 16 * dw * sx
 * where sx = dx * sum(qx), the block's x summed, computed once per call (Q5's qw: the nibble with its fifth bit
 * from qh above it, 0..31). The exact kernels dequantize every weight to a float and multiply floats, which
 * kept a batch-1 step's projections bound by the arithmetic at half the bus's speed. Here 8 weight rows are
 * multiplied together, one a lane (q8_group_t): a block of the 8 rows costs four loads and eight shuffles to
 * transpose their bytes, eight masks, eight integer dots, and one conversion and one FMA per row of x.
 *
 * Q8_0, w = dw * qw (32 signed bytes, no offset term):   dw * dx * sum(qw * qx)
 * as llama.cpp multiplies Q8_0 by 8-bit x. Its products take x86's unsigned operand in two ways, both exact: with
 * VNNI, qw + 128 (the sign bit flipped), the chain started at -128 * sum(qx); with AVX2's pmaddubsw, |qw| against
 * qx with qw's sign. NEON's sdot takes the signed bytes as they are. Q8_0 had stayed exact (SmolLM2's 30 MB head
 * read at the bus's speed either way, and rounding x for it moved perplexity by 0.78 % instead of 0.55 % with the
 * loop of that time) until Gemma 3's 178 MB head: 16 of a batch-1 step's 26 ms of CPU (amx tier, one thread).
 *
 * Rounding x costs accuracy, measured by bench/precision.py against the exact precision; and a row's result
 * depends on its step's size (these for small steps, the tiles of fast_matmul.h for larger ones). The
 * reference is q8_reference in matmul.py (tests/backends/test_native_fast.py). The AArch64 path (NEON with
 * dot products) does the same float operations in the same order as the AVX2 one, so the two give the same
 * floats (tests/backends/test_aarch64_kernels.py compares them).
 */
#ifndef PAGEDSERVE_Q8_DOTS_H
#define PAGEDSERVE_Q8_DOTS_H

#include <stdint.h>
#include <string.h>

#include "quant_wide.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q8_DOTS 1
#define Q8_X86 1
#include <immintrin.h>
#elif defined(SIMD_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define Q8_DOTS 1
#else
#define Q8_DOTS 0
#endif

/* Rows of x one group of weight rows takes at once: with AVX-512's 32 vector registers six rows' accumulators fit
 * beside the group's integers, with 16 three. */
#if defined(__AVX512F__)
#define Q8_CHUNK 6
#else
#define Q8_CHUNK 3
#endif

#if Q8_DOTS
static inline int q8_reads(int32_t type) {
    return type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1 || type == WEIGHTS_Q5_0 || type == WEIGHTS_Q5_1 ||
           type == WEIGHTS_Q8_0 || is_k_quant(type) || is_k23(type);
}

/* x rounded: m rows of k (k % 32 == 0) in one buffer of q8_x_bytes(m, k), laid out as below. */
typedef struct {
    int8_t *q;  /* m x k: qx */
    float *d;   /* m x k / 32: each block's dx */
    float *s;   /* m x k / 32: each block's sx = dx * sum(qx) */
    int32_t *n; /* m x k / 32: each block's sum(qx) (Q8_0's flipped weights take back 128 of them) */
} Q8Rows;

static inline int64_t q8_x_bytes(int64_t m, int64_t k) { return m * k + 3 * m * (k / QBLOCK) * 4; }

static inline Q8Rows q8_rows_in(void *buffer, int64_t m, int64_t k) {
    Q8Rows r;
    r.d = (float *)buffer, r.s = r.d + m * (k / QBLOCK);
    r.n = (int32_t *)(r.s + m * (k / QBLOCK));
    r.q = (int8_t *)(r.n + m * (k / QBLOCK));
    return r;
}

#define Q8_GROUP 8 /* weight rows multiplied together, one a lane */

static int64_t q8_projections; /* projections that ran this path, counted by their thread 0: the tests' proof */

static inline int64_t q8_block_bytes(int32_t type) {
    switch (type) {
    case WEIGHTS_Q4_1: return 20;
    case WEIGHTS_Q5_0: return Q5_0_BYTES;
    case WEIGHTS_Q5_1: return Q5_1_BYTES;
    case WEIGHTS_Q8_0: return 34;
    default: return 18;
    }
}

static inline int q8_has_min(int32_t type) { return type == WEIGHTS_Q4_1 || type == WEIGHTS_Q5_1; }
static inline int q8_five(int32_t type) { return type == WEIGHTS_Q5_0 || type == WEIGHTS_Q5_1; }

/* Where a block's nibbles start: after d (and m), and Q5's 4 bytes of fifth bits. */
static inline int64_t q8_nibbles_at(int32_t type) { return (q8_has_min(type) ? 4 : 2) + (q8_five(type) ? 4 : 0); }

/* mw of the types without one: -8 dw (Q4_0), -16 dw (Q5_0). */
static inline float q8_offset(int32_t type) { return type == WEIGHTS_Q5_0 ? -16.0f : -8.0f; }

#if defined(Q8_X86)
/* Block c (32 floats at x) rounded: qx = round-to-nearest-even(x / dx), as NumPy's rint of x * (1 / dx). (A block
 * whose largest value is below ~4e-37 has a subnormal dx, whose inverse is inf: its qx are then -128 where NumPy's
 * are undefined, and its products, times dx, are below 1e-36.) */
static inline void q8_block(const float *x, int8_t *q, float *d, float *s, int32_t *n) {
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
    *n = _mm_cvtsi128_si32(t);
    *d = scale, *s = scale * (float)*n;
}

/* acc + the 8 int32 sums of 4 products each of unsigned u and signed s bytes. (pmaddubsw's int16 pairs cannot
 * saturate: qw <= 31 and |qx| <= 127.) */
static inline __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* acc + the 8 int32 sums of 4 products each of signed bytes w and x: |w| against x with w's sign (|w| <= 128 and
 * |x| <= 127: a pair of pmaddubsw's products stays below 2^15). */
static inline __m256i dot_s8s8_add(__m256i acc, __m256i w, __m256i x) {
    return dot_u8s8_add(acc, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define Q8_0_UNSIGNED 1 /* Q8_0's weights flipped to unsigned (qw + 128), 128 sum(qx) taken back from the chain */
#else
#define Q8_0_UNSIGNED 0
#endif

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

/* Block b of the group's rows: each row's dw in d's lane j, and mw in m's (q8_offset's for Q4_0 / Q5_0), from
 * the block's first four bytes, gathered. */
static inline __attribute__((always_inline)) void q8_group_scales(const Q8Group *g, int64_t b, __m256 *d,
                                                                 __m256 *m, const int32_t type) {
    const __m256i pairs = _mm256_i32gather_epi32((const int *)(g->row[0] + b * q8_block_bytes(type)), g->offsets, 1);
    *d = _mm256_cvtph_ps(low_halves(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff))));
    if (type == WEIGHTS_Q8_0) { /* no offset term (q8_scale_add skips it) */
        *m = _mm256_setzero_ps();
        return;
    }
    *m = q8_has_min(type) ? _mm256_cvtph_ps(low_halves(_mm256_srli_epi32(pairs, 16)))
                          : _mm256_mul_ps(*d, _mm256_set1_ps(q8_offset(type)));
}

/* 0x10 in byte i of lane j where bit 8 k + 4 (c % 2) + i of lane j of qh is set: the fifth bits of weights
 * 8 k + 4 (c % 2) .. + 3 of each row (byte k of its qh broadcast over its lane, masked, compared). */
static inline __attribute__((always_inline)) __m256i q8_fifth4(__m256i qh, int k, int c) {
    const __m256i lane = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4,
                                          8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i spread = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane, _mm256_set1_epi8((char)k)));
    const __m256i bit = _mm256_set1_epi32(c % 2 ? (int)0x80402010 : 0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* The 16 bytes at `at` of each of the group's rows, transposed: lane j of words[c] holds row j's bytes 4c .. 4c + 3.
 * Rows j and j + 4 share a load; a 4 x 4 transpose of 32-bit words in each half puts word c of every row in one
 * vector. */
static inline __attribute__((always_inline)) void q8_transpose16(const Q8Group *g, int64_t at, __m256i words[4]) {
    __m256i p[4];
    for (int j = 0; j < 4; j++)
        p[j] = _mm256_loadu2_m128i((const __m128i *)(g->row[j + 4] + at), (const __m128i *)(g->row[j] + at));
    const __m256i t0 = _mm256_unpacklo_epi32(p[0], p[1]), t1 = _mm256_unpackhi_epi32(p[0], p[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(p[2], p[3]), t3 = _mm256_unpackhi_epi32(p[2], p[3]);
    words[0] = _mm256_unpacklo_epi64(t0, t2), words[1] = _mm256_unpackhi_epi64(t0, t2);
    words[2] = _mm256_unpacklo_epi64(t1, t3), words[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Block b of the group's rows, transposed: lane j of lo[c] holds row j's weights 4c .. 4c + 3 as bytes, of
 * hi[c] its weights 4c + 16 .. 4c + 19 (a block's byte i holds weight i low and weight i + 16 high; Q5's fifth
 * bits from its qh, gathered). */
static inline __attribute__((always_inline)) void q8_group_weights(const Q8Group *g, int64_t b, __m256i lo[4],
                                                                  __m256i hi[4], const int32_t type) {
    if (type == WEIGHTS_Q8_0) { /* 32 signed bytes after d: as they are, or + 128 for vpdpbusd */
        q8_transpose16(g, b * q8_block_bytes(type) + 2, lo);
        q8_transpose16(g, b * q8_block_bytes(type) + 18, hi);
        for (int c = 0; c < 4 && Q8_0_UNSIGNED; c++)
            lo[c] = _mm256_xor_si256(lo[c], _mm256_set1_epi8((char)0x80)),
            hi[c] = _mm256_xor_si256(hi[c], _mm256_set1_epi8((char)0x80));
        return;
    }
    const int64_t at = b * q8_block_bytes(type) + q8_nibbles_at(type);
    __m256i words[4];
    q8_transpose16(g, at, words);
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        lo[c] = _mm256_and_si256(words[c], nibble);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(words[c], 4), nibble);
    }
    if (!q8_five(type)) return;
    const __m256i qh = _mm256_i32gather_epi32((const int *)(g->row[0] + at - 4), g->offsets, 1);
    for (int c = 0; c < 4; c++) {
        lo[c] = _mm256_or_si256(lo[c], q8_fifth4(qh, c / 2, c));
        hi[c] = _mm256_or_si256(hi[c], q8_fifth4(qh, 2 + c / 2, c));
    }
}

/* Four bytes of x broadcast to every lane. */
static inline __m256i q8_x_word(const int8_t *q) {
    int32_t word;
    memcpy(&word, q, sizeof word);
    return _mm256_set1_epi32(word);
}

/* acc + the products of 4 weight bytes (lane j: row j's) with 4 of x: the weights unsigned, or Q8_0's signed
 * ones (flipped to unsigned with VNNI, whose chain starts at -128 sum(qx)). */
static inline __attribute__((always_inline)) __m256i q8_dot_add(__m256i acc, __m256i w, __m256i x, const int32_t type) {
    return type == WEIGHTS_Q8_0 && !Q8_0_UNSIGNED ? dot_s8s8_add(acc, w, x) : dot_u8s8_add(acc, w, x);
}

/* The integer dot product of block b of row i of x (its sum(qx) `sum`) with the group's rows, one lane a row: two
 * chains of four. */
static inline __attribute__((always_inline)) __m256i q8_group_dots(const __m256i lo[4], const __m256i hi[4],
                                                                  const int8_t *qx, int32_t sum, const int32_t type) {
    const int flipped = type == WEIGHTS_Q8_0 && Q8_0_UNSIGNED;
    __m256i even = _mm256_set1_epi32(flipped ? -128 * sum : 0), odd = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        even = q8_dot_add(even, lo[c], q8_x_word(qx + 4 * c), type);
        odd = q8_dot_add(odd, hi[c], q8_x_word(qx + 16 + 4 * c), type);
    }
    return _mm256_add_epi32(even, odd);
}

/* One row of x's block `at` (its dx and sx) into its two chains, lanes the group's rows: dots * (dw * dx), then
 * mw * sx (the float operations, and their order, of every type and tier). */
static inline __attribute__((always_inline)) void q8_scale_add(__m256i dots, __m256 d, __m256 m, const Q8Rows *x,
                                                               int64_t at, __m256 *acc, __m256 *mins,
                                                               const int offset) {
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d, _mm256_set1_ps(x->d[at])), *acc);
    if (offset) *mins = _mm256_fmadd_ps(m, _mm256_set1_ps(x->s[at]), *mins);
}

/* y[i, first + j] (+)= acc + mins of row i of x, for the group's valid rows. */
static inline __attribute__((always_inline)) void q8_group_store(const __m256 acc[Q8_CHUNK],
                                                                 const __m256 mins[Q8_CHUNK], int rows, float *y,
                                                                 int64_t n, int64_t first, int add) {
    const int64_t valid = n - first < Q8_GROUP ? n - first : Q8_GROUP;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i = 0; i < rows; i++) {
        float *out = y + i * n + first;
        __m256 v = _mm256_add_ps(acc[i], mins[i]);
        if (add) v = _mm256_add_ps(v, _mm256_maskload_ps(out, mask));
        _mm256_maskstore_ps(out, mask, v);
    }
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
    __m256 acc[Q8_CHUNK], mins[Q8_CHUNK];
    for (int i = 0; i < rows; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        __m256 d, m;
        __m256i lo[4], hi[4];
        q8_group_scales(&g, b, &d, &m, type);
        q8_group_weights(&g, b, lo, hi, type);
        for (int i = 0; i < rows; i++) {
            const int64_t at = i * blocks + b;
            q8_scale_add(q8_group_dots(lo, hi, x->q + at * QBLOCK, x->n[at], type), d, m, x, at, &acc[i], &mins[i],
                         type != WEIGHTS_Q8_0);
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#else
/* q8_block with NEON: the same rounding (vcvtnq_s32_f32: to nearest, ties to even), narrowed to int8 with
 * saturation (vqmovn) where AVX2's packs saturate. (A block with a subnormal dx saturates its qx to +-127 here
 * where AVX2 gives -128, and sums them differently: products below 1e-36 either way.) */
static inline void q8_block(const float *x, int8_t *q, float *d, float *s, int32_t *n) {
    float32x4_t v[8], big = vdupq_n_f32(0.0f);
    for (int u = 0; u < 8; u++) {
        v[u] = vld1q_f32(x + 4 * u);
        big = vmaxq_f32(big, vabsq_f32(v[u]));
    }
    const float amax = vmaxvq_f32(big), scale = amax / 127.0f; /* the max of floats is exact in any order */
    const float32x4_t inverse = vdupq_n_f32(scale != 0.0f ? 1.0f / scale : 0.0f);
    int32x4_t i[8], total = vdupq_n_s32(0);
    for (int u = 0; u < 8; u++) {
        i[u] = vcvtnq_s32_f32(vmulq_f32(v[u], inverse));
        total = vaddq_s32(total, i[u]);
    }
    int16x8_t h[4];
    for (int u = 0; u < 4; u++) h[u] = vcombine_s16(vqmovn_s32(i[2 * u]), vqmovn_s32(i[2 * u + 1]));
    vst1q_s8(q, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
    vst1q_s8(q + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
    *n = vaddvq_s32(total);
    *d = scale, *s = scale * (float)*n;
}

/* The float16 at `offset` of four rows (a block's d or m), widened (exact): gathered one by one. */
static inline float32x4_t q8_scales4(const uint8_t *const *rows, int64_t offset) {
    uint16_t halves[4];
    for (int j = 0; j < 4; j++) halves[j] = load_u16(rows[j] + offset);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(halves)));
}

/* The integer dot products of one row of x's block (xlo: its values 0-15, xhi: 16-31) with four weight rows'
 * blocks (lo: their low nibbles, weights 0-15; hi: their high ones, 16-31), one lane a row: each row's two sdots
 * leave four partial sums, and two levels of pairwise adds give each row's total (exact integers). */
static inline __attribute__((always_inline)) int32x4_t q8_dots4(const int8x16_t *lo, const int8x16_t *hi,
                                                              int8x16_t xlo, int8x16_t xhi) {
    int32x4_t part[4];
    for (int j = 0; j < 4; j++) part[j] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo[j], xlo), hi[j], xhi);
    return vpaddq_s32(vpaddq_s32(part[0], part[1]), vpaddq_s32(part[2], part[3]));
}

/* y[i, first + j] (+)= acc + mins of row i of x, for the group's valid rows. */
static inline __attribute__((always_inline)) void q8_group_store(float32x4_t acc[3][2], float32x4_t mins[3][2],
                                                                 int rows, float *y, int64_t n, int64_t first,
                                                                 int add) {
    const int64_t valid = n - first < Q8_GROUP ? n - first : Q8_GROUP;
    for (int i = 0; i < rows; i++) {
        float sums[Q8_GROUP], *out = y + i * n + first;
        vst1q_f32(sums, vaddq_f32(acc[i][0], mins[i][0]));
        vst1q_f32(sums + 4, vaddq_f32(acc[i][1], mins[i][1]));
        for (int j = 0; j < valid; j++) out[j] = add ? sums[j] + out[j] : sums[j];
    }
}

/* AVX2's q8_group_t with NEON: lane j of the two float vectors (rows 0-3, 4-7) is weight row first + j (past n
 * the last row again, computed and not stored), and each row of x's block costs the same float operations in
 * the same order: dots converted, one FMA by dw * dx (rounded first), one FMA of mw by sx, then the sum. */
static inline __attribute__((always_inline)) void q8_group_t(const Q8Rows *x, const Weights *w, float *y, int64_t k,
                                                            int64_t n, int64_t first, int add, const int rows,
                                                            const int32_t type) {
    const int64_t blocks = k / QBLOCK, bytes = q8_block_bytes(type), nibbles = q8_nibbles_at(type);
    const uint8_t *row[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) row[j] = weights_row(w, first + j < n ? first + j : n - 1);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    float32x4_t acc[3][2], mins[3][2];
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 2; h++) acc[i][h] = mins[i][h] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        float32x4_t d[2], m[2];
        int8x16_t lo[Q8_GROUP], hi[Q8_GROUP];
        for (int h = 0; h < 2; h++) {
            d[h] = q8_scales4(row + 4 * h, b * bytes);
            m[h] = q8_has_min(type) ? q8_scales4(row + 4 * h, b * bytes + 2) : vmulq_n_f32(d[h], q8_offset(type));
        }
        for (int j = 0; j < Q8_GROUP && type == WEIGHTS_Q8_0; j++) { /* 32 signed bytes after d, as they are */
            lo[j] = vld1q_s8((const int8_t *)row[j] + b * bytes + 2);
            hi[j] = vld1q_s8((const int8_t *)row[j] + b * bytes + 18);
        }
        for (int j = 0; j < Q8_GROUP && type != WEIGHTS_Q8_0; j++) {
            const uint8x16_t q = vld1q_u8(row[j] + b * bytes + nibbles);
            u8x16 fifth[2] = {{0}, {0}};
            if (q8_five(type)) fifth_bits(row[j] + b * bytes + nibbles - 4, fifth); /* quant_k.h */
            lo[j] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), (uint8x16_t)fifth[0]));
            hi[j] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), (uint8x16_t)fifth[1]));
        }
        for (int i = 0; i < rows; i++) {
            const int64_t at = i * blocks + b;
            const int8x16_t xlo = vld1q_s8(x->q + at * QBLOCK), xhi = vld1q_s8(x->q + at * QBLOCK + 16);
            for (int h = 0; h < 2; h++) {
                const float32x4_t dots = vcvtq_f32_s32(q8_dots4(lo + 4 * h, hi + 4 * h, xlo, xhi));
                acc[i][h] = vfmaq_f32(acc[i][h], dots, vmulq_n_f32(d[h], x->d[at]));
                if (type != WEIGHTS_Q8_0) mins[i][h] = vfmaq_n_f32(mins[i][h], m[h], x->s[at]); /* no offset */
            }
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#endif

#include "q8_k.h"   /* the K-quants' groups */
#include "q8_k23.h" /* Q2_K's and Q3_K's */
#include "q8_lanes.h" /* Q8_0's and the K-quants', rows of x in lanes, for steps of 8+ rows (AVX-512 VNNI) */

/* Every row of x rounded into r. */
static void q8_quantize(const float *x, int64_t m, int64_t k, const Q8Rows *r) {
    for (int64_t c = 0; c < m * k / QBLOCK; c++)
        q8_block(x + c * QBLOCK, r->q + c * QBLOCK, r->d + c, r->s + c, r->n + c);
}

#if Q8_CHUNK > 3
#define Q8_WIDE_CASES(F, T)                                                                                         \
    case 6: F(x, w, y, k, n, first, add, 6, T); break;                                                              \
    case 5: F(x, w, y, k, n, first, add, 5, T); break;                                                              \
    case 4: F(x, w, y, k, n, first, add, 4, T); break;
#else
#define Q8_WIDE_CASES(F, T)
#endif

/* One group for every row of x (1..Q8_CHUNK), the count and the type constants. */
__attribute__((aligned(HOT_ALIGN))) static void q8_group_of(const Q8Rows *x, const Weights *w, float *y, int64_t m,
                                                            int64_t k, int64_t n, int64_t first, int add) {
#define Q8_GROUP_ROWS(F, T)                                                                                         \
    switch (m) {                                                                                                    \
    Q8_WIDE_CASES(F, T)                                                                                             \
    case 3: F(x, w, y, k, n, first, add, 3, T); break;                                                              \
    case 2: F(x, w, y, k, n, first, add, 2, T); break;                                                              \
    default: F(x, w, y, k, n, first, add, 1, T); break;                                                            \
    }
    switch (w->type) {
    case WEIGHTS_Q4_1: Q8_GROUP_ROWS(q8_group_t, WEIGHTS_Q4_1) break;
    case WEIGHTS_Q5_0: Q8_GROUP_ROWS(q8_group_t, WEIGHTS_Q5_0) break;
    case WEIGHTS_Q5_1: Q8_GROUP_ROWS(q8_group_t, WEIGHTS_Q5_1) break;
    case WEIGHTS_Q4_K: Q8_GROUP_ROWS(q8_group_k_t, WEIGHTS_Q4_K) break;
    case WEIGHTS_Q5_K: Q8_GROUP_ROWS(q8_group_k_t, WEIGHTS_Q5_K) break;
    case WEIGHTS_Q6_K: Q8_GROUP_ROWS(q8_group_k_t, WEIGHTS_Q6_K) break;
    case WEIGHTS_Q8_0: Q8_GROUP_ROWS(q8_group_t, WEIGHTS_Q8_0) break;
    default: Q8_GROUP_ROWS(q8_group_t, WEIGHTS_Q4_0) break;
    }
#undef Q8_GROUP_ROWS
}

/* Rows [first, first + count) of x rounded: the same layout, a view into it. */
static inline Q8Rows q8_rows_from(const Q8Rows *x, int64_t first, int64_t k) {
    const int64_t blocks = k / QBLOCK;
    return (Q8Rows){x->q + first * k, x->d + first * blocks, x->s + first * blocks, x->n + first * blocks};
}

/* y (m, n) (+)= x (m, k) @ w.T for q8_reads(w->type), shared among the threads of the enclosing OpenMP region as
 * project_weights; `mine`: this thread's q8_x_bytes(m, k), where it rounds x itself (a few thousand values:
 * cheaper than a barrier). A group of 8 weight rows takes x Q8_CHUNK rows at a time, so for more rows its bytes
 * come again from L1 and only their decoding is paid again; each row's sums are the same operations in the same
 * order whatever the rows beside it, so a row's result does not depend on its step's size here. */
static void project_q8(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                       void *mine) {
    const Q8Rows rows = q8_rows_in(mine, m, k);
    q8_quantize(x, m, k, &rows);
#if Q8_LANES
    if (q8_lanes_read(w->type) && m >= Q8_LANES_MIN_ROWS) {
        project_q8_lanes(&rows, w, y, m, k, n, add, (char *)mine + q8_x_bytes(m, k));
        return;
    }
#endif
    /* Q2_K / Q3_K sent apart here, not in q8_group_of: a test for them there changed its code for every type */
    const int k23 = is_k23(w->type);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (n + Q8_GROUP - 1) / Q8_GROUP; t++)
        for (int64_t r = 0; r < m; r += Q8_CHUNK) {
            const Q8Rows chunk = q8_rows_from(&rows, r, k);
            const int64_t count = m - r < Q8_CHUNK ? m - r : Q8_CHUNK;
            if (k23)
                q8_group_k23(&chunk, w, y + r * n, count, k, n, t * Q8_GROUP, add);
            else
                q8_group_of(&chunk, w, y + r * n, count, k, n, t * Q8_GROUP, add);
        }
}
#include "q8_grouped.h" /* Q8_0 regrouped at load, any rows (AVX-512 VNNI) */

/* What project_q8 needs of a thread's buffer: x rounded, and for Q8_LANES x in lanes too. */
static inline int64_t q8_work_bytes(int64_t m, int64_t k) { return q8_x_bytes(m, k) + q8_lanes_bytes(m, k); }
#else
#define Q8_LANES 0
static inline int q8_reads(int32_t type) { return (void)type, 0; }
static inline int q8_lanes_read(int32_t type) { return (void)type, 0; }
static inline int64_t q8_work_bytes(int64_t m, int64_t k) { return (void)m, (void)k, 0; }
#endif

#endif
