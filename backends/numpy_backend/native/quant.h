/* Weight matrices as a GGUF file stores them, read by the projections without a float32 copy.
 *
 * A matrix is rows of bytes: blocks of 32 weights (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1), super-blocks of 256 (Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K: quant_k.h, read 32 weights at a time), plain 16-bit floats (F16, BF16), or float32. Each value is
 * dequantized in registers exactly as the `gguf` package's NumPy code computes it (here d * q, then + m, each
 * rounded to float32; d * q is exact for these types, so one FMA gives the same value; quant_k.h's types
 * likewise), so the projections of quant_matmul.h give the same floats from the stored matrix as matmul.h gives
 * from its float32 copy. The reference is gguf's `quants.dequantize` (tests/backends/test_native_quant.py).
 */
#ifndef PAGEDSERVE_QUANT_H
#define PAGEDSERVE_QUANT_H

#include <stdint.h>
#include <string.h>

#include "half.h"
#include "simd.h"

/* ggml's type ids, as the file stores them */
enum {
    WEIGHTS_F32 = 0, WEIGHTS_F16 = 1, WEIGHTS_Q4_0 = 2, WEIGHTS_Q4_1 = 3, WEIGHTS_Q5_0 = 6, WEIGHTS_Q5_1 = 7,
    WEIGHTS_Q8_0 = 8, WEIGHTS_Q2_K = 10, WEIGHTS_Q3_K = 11, WEIGHTS_Q4_K = 12, WEIGHTS_Q5_K = 13, WEIGHTS_Q6_K = 14, WEIGHTS_BF16 = 30,
    /* ours: Q5_0 and Q8_0 regrouped 16 rows at a time (q8_grouped.h), for the fast precision only */
    WEIGHTS_Q5_0_G16 = 1006, WEIGHTS_Q8_0_G16 = 1008
};
/* Whether this build reads the regrouped types (their kernel needs AVX-512 VNNI); their rows are not rows of
 * blocks, so only that kernel may see them */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define Q8_GROUPED_BUILT 1
#else
#define Q8_GROUPED_BUILT 0
#endif
#define QBLOCK 32 /* weights per block of the quantized types */
/* The start of the functions that hold the tiles' loops (project_tile_q, tile_more_rows, q8_group_of): one
 * cache line, so that code added elsewhere cannot move their loops across the front end's fetch windows (adding
 * Q2_K / Q3_K's functions moved them from 0 to 16 bytes into a line, and a 4-row step on avx2 took 3 % more). */
#define HOT_ALIGN 64

typedef struct {
    const uint8_t *data; /* row r starts at data + r * row_bytes */
    int64_t row_bytes;
    int32_t type;
} Weights;

static inline const uint8_t *weights_row(const Weights *w, int64_t r) { return w->data + r * w->row_bytes; }

/* 1 for the regrouped types (q8_grouped.h), which only the fast precision's grouped kernels read. */
static inline int is_grouped(int32_t type) { return type == WEIGHTS_Q5_0_G16 || type == WEIGHTS_Q8_0_G16; }

typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));
typedef uint16_t u16x8 __attribute__((vector_size(16), aligned(1)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* 16 4-bit (or 8-bit) integers q as weights, rounded as gguf computes them: d * q + m (Q4_1), d * (q - 8)
 * (Q4_0), d * q (signed, Q8_0); into out[0] (the first 8) and out[1]. Intrinsics where the target has them:
 * GCC turns a generic byte-to-float conversion into one scalar conversion per lane. */
enum { DEQ_MIN, DEQ_OFFSET8, DEQ_SIGNED };

#if defined(__AVX512F__) && defined(__AVX512DQ__)
static inline __attribute__((always_inline)) void deq16(u8x16 q, float d, float m, int kind, vec8 out[2]) {
    const __m128i bytes = (__m128i)q;
    __m512 v = _mm512_cvtepi32_ps(kind == DEQ_SIGNED ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
    if (kind == DEQ_OFFSET8) {
        v = _mm512_sub_ps(v, _mm512_set1_ps(8.0f)); /* exact */
        __asm__("" : "+v"(v));
        v = _mm512_mul_ps(v, _mm512_set1_ps(d));
    } else {
        v = _mm512_mul_ps(v, _mm512_set1_ps(d));
        if (kind == DEQ_MIN) {
            __asm__("" : "+v"(v)); /* two roundings, as gguf: never one FMA */
            v = _mm512_add_ps(v, _mm512_set1_ps(m));
        }
    }
    out[0] = (vec8)_mm512_castps512_ps256(v), out[1] = (vec8)_mm512_extractf32x8_ps(v, 1);
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) vec8 deq8_avx2(__m128i bytes, float d, float m, int kind) {
    __m256 v = _mm256_cvtepi32_ps(kind == DEQ_SIGNED ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
    if (kind == DEQ_OFFSET8) {
        v = _mm256_sub_ps(v, _mm256_set1_ps(8.0f));
        __asm__("" : "+x"(v));
        return (vec8)_mm256_mul_ps(v, _mm256_set1_ps(d));
    }
    v = _mm256_mul_ps(v, _mm256_set1_ps(d));
    if (kind == DEQ_MIN) {
        __asm__("" : "+x"(v));
        v = _mm256_add_ps(v, _mm256_set1_ps(m));
    }
    return (vec8)v;
}

static inline __attribute__((always_inline)) void deq16(u8x16 q, float d, float m, int kind, vec8 out[2]) {
    out[0] = deq8_avx2((__m128i)q, d, m, kind), out[1] = deq8_avx2(_mm_srli_si128((__m128i)q, 8), d, m, kind);
}
#elif defined(__SSE2__)
#include <emmintrin.h>
/* x86-64's baseline (the generic tier): bytes widened by unpacking, 4 lanes at a time. GCC's own byte-to-float
 * conversion of 32-byte vectors on a 16-byte target went byte by byte through the stack: a Q4_1 step took 6.6x
 * the CPU time these take. Without FMA in the instruction set, d * q + m is two roundings, as gguf computes it. */
static inline __attribute__((always_inline)) __m128 deq4_sse2(__m128i ints, float d, float m, int kind) {
    __m128 v = _mm_cvtepi32_ps(ints);
    if (kind == DEQ_OFFSET8) v = _mm_sub_ps(v, _mm_set1_ps(8.0f));
    v = _mm_mul_ps(v, _mm_set1_ps(d));
    return kind == DEQ_MIN ? _mm_add_ps(v, _mm_set1_ps(m)) : v;
}

static inline __attribute__((always_inline)) void deq16(u8x16 q, float d, float m, int kind, vec8 out[2]) {
    const __m128i bytes = (__m128i)q, zero = _mm_setzero_si128();
    const int sign = kind == DEQ_SIGNED; /* signed: each byte doubled into a word, then shifted down */
    const __m128i words[2] = {
        sign ? _mm_srai_epi16(_mm_unpacklo_epi8(bytes, bytes), 8) : _mm_unpacklo_epi8(bytes, zero),
        sign ? _mm_srai_epi16(_mm_unpackhi_epi8(bytes, bytes), 8) : _mm_unpackhi_epi8(bytes, zero)};
    __m128 parts[4];
    for (int i = 0; i < 2; i++) {
        parts[2 * i] = deq4_sse2(_mm_srai_epi32(_mm_unpacklo_epi16(words[i], words[i]), 16), d, m, kind);
        parts[2 * i + 1] = deq4_sse2(_mm_srai_epi32(_mm_unpackhi_epi16(words[i], words[i]), 16), d, m, kind);
    }
    memcpy(out, parts, sizeof parts);
}
#elif defined(SIMD_NEON)
/* 16 bytes as NEON pairs (simd.h), widened u8 -> u16 -> u32 (or signed) and converted, 4 lanes at a time. */
static inline __attribute__((always_inline)) void deq16_pairs(uint8x16_t q, float d, float m, int kind,
                                                              pair8 out[2]) {
    float32x4_t v[4];
    if (kind == DEQ_SIGNED) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(vreinterpretq_s8_u8(q))), hi = vmovl_high_s8(vreinterpretq_s8_u8(q));
        v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), v[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
        v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), v[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
    } else {
        const uint16x8_t lo = vmovl_u8(vget_low_u8(q)), hi = vmovl_high_u8(q);
        v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), v[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
        v[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), v[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (kind == DEQ_OFFSET8) v[i] = vsubq_f32(v[i], vdupq_n_f32(8.0f)); /* exact */
        v[i] = vmulq_n_f32(v[i], d);
        if (kind == DEQ_MIN) {
            /* two roundings, as gguf's steps (arm_neon.h's vmulq and vaddq are plain * and +, which GCC fuses;
             * for Q4_1, 4-bit q times a float16 d is exact, so this keeps the steps, not the value) */
            __asm__("" : "+w"(v[i]));
            v[i] = vaddq_f32(v[i], vdupq_n_f32(m));
        }
    }
    out[0] = (pair8){v[0], v[1]}, out[1] = (pair8){v[2], v[3]};
}

static inline __attribute__((always_inline)) void deq16(u8x16 q, float d, float m, int kind, vec8 out[2]) {
    pair8 p[2];
    deq16_pairs((uint8x16_t)q, d, m, kind, p);
    out[0] = vec8_of(p[0]), out[1] = vec8_of(p[1]);
}
#else
static inline __attribute__((always_inline)) void deq16(u8x16 q, float d, float m, int kind, vec8 out[2]) {
    for (int i = 0; i < 16; i++) {
        volatile float v = (kind == DEQ_SIGNED ? (float)(int8_t)q[i] : (float)q[i]); /* volatile: no fusing */
        if (kind == DEQ_OFFSET8) v = v - 8.0f;
        v = v * d;
        if (kind == DEQ_MIN) v = v + m;
        out[i / 8][i % 8] = v;
    }
}
#endif

/* Block b of a Q4_0 / Q4_1 row: byte j holds weight j (low nibble) and weight j + 16 (high nibble). With
 * AVX-512 the block's 16 possible values (d * q + m, or d * (q - 8), for q = 0..15) are computed once, as gguf
 * computes them, and each nibble picks its value from that table (vpermps): fewer float operations than
 * converting and scaling all 32 (a batch-1 step's projections took 15 % less time). */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
static inline __attribute__((always_inline)) void deq_q4(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    const uint8_t *block = row + b * (with_min ? 20 : 18);
    uint32_t halves; /* d and m (Q4_1), or d and the first two bytes of q (Q4_0, ignored) */
    memcpy(&halves, block, sizeof halves);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)halves));
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = with_min ? iota : _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)); /* q - 8: exact */
    table = _mm512_mul_ps(table, _mm512_broadcastss_ps(dm));
    if (with_min) {
        __asm__("" : "+v"(table)); /* two roundings, as gguf: never one FMA */
        table = _mm512_add_ps(table, _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
    }
    const __m128i q = _mm_loadu_si128((const __m128i *)(block + (with_min ? 4 : 2))), low = _mm_set1_epi8(0x0f);
    const __m512 lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low)), table);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low)), table);
    out[0] = (vec8)_mm512_castps512_ps256(lo), out[1] = (vec8)_mm512_extractf32x8_ps(lo, 1);
    out[2] = (vec8)_mm512_castps512_ps256(hi), out[3] = (vec8)_mm512_extractf32x8_ps(hi, 1);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The AVX2 tier, in fewer operations per weight (one thread of an AMD EPYC, bench.projection_rate:
 * a batch-1 Q4_1 projection 8.0 -> 10.7 Gweights/s):
 *   - the block's 16 stored bytes widened to dwords straight from memory, 8 at a time (two loads that widen),
 *     then split into low nibbles (and) and high ones (shift): no byte shuffles before the widening;
 *   - d and m converted together (one vcvtph2ps), then broadcast;
 *   - Q4_1's d * q + m as one FMA: d * q is exact in float32 (q has 4 bits, a float16 d 11), so rounding
 *     d * q + m once gives gguf's two roundings' value, bit for bit.
 * Weights 0-7, 8-15 (low nibbles of bytes 0-7, 8-15), 16-23, 24-31 (their high nibbles) into out[0..3]. */
static inline __attribute__((always_inline)) void deq_q4(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    const uint8_t *block = row + b * (with_min ? 20 : 18);
    const uint8_t *q = block + (with_min ? 4 : 2);
    uint32_t halves; /* d and m (Q4_1), or d and the first two bytes of q (Q4_0, ignored) */
    memcpy(&halves, block, sizeof halves);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)halves));
    const __m256 d = _mm256_broadcastss_ps(dm);
    const __m256 m = with_min ? _mm256_broadcastss_ps(_mm_movehdup_ps(dm)) : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    const __m256i low = _mm256_set1_epi32(0x0f);
    __m256i bytes[2];
    for (int h = 0; h < 2; h++) bytes[h] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * h)));
    for (int h = 0; h < 2; h++) {
        out[h] = (vec8)_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(bytes[h], low)), m);
        out[h + 2] = (vec8)_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[h], 4)), m);
    }
}
#else
static inline __attribute__((always_inline)) void deq_q4(const uint8_t *row, int64_t b, int with_min, vec8 out[4]) {
    const uint8_t *block = row + b * (with_min ? 20 : 18);
    const float d = half_to_float(load_u16(block)), m = with_min ? half_to_float(load_u16(block + 2)) : 0.0f;
    const u8x16 q = *(const u8x16 *)(block + (with_min ? 4 : 2));
    const int kind = with_min ? DEQ_MIN : DEQ_OFFSET8;
    deq16(q & 0x0f, d, m, kind, out);
    deq16(q >> 4, d, m, kind, out + 2);
}
#endif

static inline __attribute__((always_inline)) void deq_q8_0(const uint8_t *row, int64_t b, vec8 out[4]) {
    const uint8_t *block = row + b * 34;
    const float d = half_to_float(load_u16(block));
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* 8 bytes at a time, widened by their load (deq_q4's AVX2 note): Q8_0 9.3 -> 11.2 Gweights/s */
    for (int u = 0; u < 4; u++) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(block + 2 + 8 * u)));
        out[u] = (vec8)_mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d));
    }
#else
    deq16(*(const u8x16 *)(block + 2), d, 0.0f, DEQ_SIGNED, out);
    deq16(*(const u8x16 *)(block + 18), d, 0.0f, DEQ_SIGNED, out + 2);
#endif
}

#include "quant_k.h" /* Q5_0, Q5_1 and the K-quants: after deq16, which its tiers without AVX2 use */

/* 8 bfloat16 values from p (exact conversions). */
static inline vec8 deq8_bf16(const uint8_t *p) {
    const u32x8 bits = __builtin_convertvector(*(const u16x8 *)p, u32x8) << 16;
    vec8 v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Chunk c (8 weights: c * 8 .. c * 8 + 7) of a float row: float32, float16 or bfloat16. */
static inline vec8 deq8_float(const uint8_t *row, int32_t type, int64_t c) {
    if (type == WEIGHTS_F16) return deq8_f16(row + c * 16);
    if (type == WEIGHTS_BF16) return deq8_bf16(row + c * 16);
    vec8 v;
    memcpy(&v, row + c * 32, sizeof v);
    return v;
}

/* Block b (weights b * 32 .. b * 32 + 31) of a row, as 4 vectors of 8; ks: the K-quants' scales of its
 * super-block (k_scales_at, before the block; unread for the other types). */
static inline __attribute__((always_inline)) void deq_block(const uint8_t *row, int32_t type, int64_t b,
                                                            const KScales *ks, vec8 out[4]) {
    switch (type) {
    case WEIGHTS_Q4_0: deq_q4(row, b, 0, out); break;
    case WEIGHTS_Q4_1: deq_q4(row, b, 1, out); break;
    case WEIGHTS_Q8_0: deq_q8_0(row, b, out); break;
    case WEIGHTS_Q5_0: deq_q5(row, b, 0, out); break;
    case WEIGHTS_Q5_1: deq_q5(row, b, 1, out); break;
    case WEIGHTS_Q4_K: deq_q4_k(row, b, ks, out); break;
    case WEIGHTS_Q5_K: deq_q5_k(row, b, ks, out); break;
    case WEIGHTS_Q6_K: deq_q6_k(row, b, ks, out); break;
    case WEIGHTS_Q2_K: deq_q2_k(row, b, out); break;
    case WEIGHTS_Q3_K: deq_q3_k(row, b, out); break;
    default:
        for (int u = 0; u < 4; u++) out[u] = deq8_float(row, type, 4 * b + u);
    }
}

#if defined(SIMD_NEON)
/* deq8_float as a NEON pair. */
static inline pair8 deq_pair_float(const uint8_t *row, int32_t type, int64_t c) {
    if (type == WEIGHTS_F16) return half_pair(row + c * 16);
    if (type == WEIGHTS_BF16) {
        const uint16x8_t bits = vreinterpretq_u16_u8(vld1q_u8(row + c * 16));
        return (pair8){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(bits), 16)),
                       vreinterpretq_f32_u32(vshll_high_n_u16(bits, 16))};
    }
    return load_pair(row + c * 32);
}

/* deq_block as NEON pairs, for the NEON loops of quant_matmul.h: the same values (deq_q4's, deq_q8_0's and
 * quant_k.h's arithmetic, by deq16_pairs). */
static inline __attribute__((always_inline)) void deq_block_pairs(const uint8_t *row, int32_t type, int64_t b,
                                                                  const KScales *ks, pair8 out[4]) {
    if (type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1) {
        const int with_min = type == WEIGHTS_Q4_1, kind = with_min ? DEQ_MIN : DEQ_OFFSET8;
        const uint8_t *block = row + b * (with_min ? 20 : 18);
        const float d = half_to_float(load_u16(block)), m = with_min ? half_to_float(load_u16(block + 2)) : 0.0f;
        const uint8x16_t q = vld1q_u8(block + (with_min ? 4 : 2));
        deq16_pairs(vandq_u8(q, vdupq_n_u8(0x0f)), d, m, kind, out);
        deq16_pairs(vshrq_n_u8(q, 4), d, m, kind, out + 2);
    } else if (type == WEIGHTS_Q8_0) {
        const uint8_t *block = row + b * 34;
        const float d = half_to_float(load_u16(block));
        deq16_pairs(vld1q_u8(block + 2), d, 0.0f, DEQ_SIGNED, out);
        deq16_pairs(vld1q_u8(block + 18), d, 0.0f, DEQ_SIGNED, out + 2);
    } else if (eight_lanes_only(type)) {
        const QBlock k = qblock_of(row, type, b, ks);
        const int kind = qblock_kind(type);
        deq16_pairs((uint8x16_t)k.q[0], k.d[0], k.m[0], kind, out);
        deq16_pairs((uint8x16_t)k.q[1], k.d[1], k.m[1], kind, out + 2);
    } else {
        for (int u = 0; u < 4; u++) out[u] = deq_pair_float(row, type, 4 * b + u);
    }
}
#endif

static inline int is_quantized(int32_t type) {
    return type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1 || type == WEIGHTS_Q8_0 || eight_lanes_only(type);
}

/* A row of k values as float32 into out: k % 32 == 0 for the quantized types (% 256 for the K-quants), k % 8 == 0
 * for the others. `type`
 * is a constant where this is inlined (DISPATCH_TYPE), so deq_block's switch is resolved at compile time. */
static inline __attribute__((always_inline)) void dequantize_row_t(const uint8_t *row, int64_t k, float *out,
                                                                   const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    KScales ks;
    for (int64_t b = 0; b < blocks; b++) {
        k_scales_at(row, type, b, &ks);
#if defined(SIMD_NEON)
        pair8 v[4];
        deq_block_pairs(row, type, b, &ks, v);
        for (int u = 0; u < 4; u++) store_pair(out + b * QBLOCK + u * LANES, v[u]);
#else
        vec8 v[4];
        deq_block(row, type, b, &ks, v);
        memcpy(out + b * QBLOCK, v, sizeof v);
#endif
    }
    for (int64_t c = blocks * 4; c < k / LANES; c++) {
        const vec8 v = deq8_float(row, type, c);
        memcpy(out + c * LANES, &v, sizeof v);
    }
}

/* CALL(T) for the runtime `type` given as the constant T: one copy of an always_inline loop per type, each with
 * its dequantization resolved at compile time (a switch per block kept the loops from unrolling and their
 * accumulators out of registers: 6x slower). Not Q2_K / Q3_K (is_k23): each caller sends those to its own
 * out-of-line copies first (DISPATCH_K23), so that adding them left the code of these loops as it was. */
#define DISPATCH_TYPE(type, CALL)                                                                                   \
    switch (type) {                                                                                                 \
    case WEIGHTS_Q4_0: CALL(WEIGHTS_Q4_0); break;                                                                   \
    case WEIGHTS_Q4_1: CALL(WEIGHTS_Q4_1); break;                                                                   \
    case WEIGHTS_Q8_0: CALL(WEIGHTS_Q8_0); break;                                                                   \
    case WEIGHTS_Q5_0: CALL(WEIGHTS_Q5_0); break;                                                                   \
    case WEIGHTS_Q5_1: CALL(WEIGHTS_Q5_1); break;                                                                   \
    case WEIGHTS_Q4_K: CALL(WEIGHTS_Q4_K); break;                                                                   \
    case WEIGHTS_Q5_K: CALL(WEIGHTS_Q5_K); break;                                                                   \
    case WEIGHTS_Q6_K: CALL(WEIGHTS_Q6_K); break;                                                                   \
    case WEIGHTS_F16: CALL(WEIGHTS_F16); break;                                                                     \
    case WEIGHTS_BF16: CALL(WEIGHTS_BF16); break;                                                                   \
    default: CALL(WEIGHTS_F32); break;                                                                              \
    }

/* DISPATCH_TYPE for Q2_K and Q3_K (`type` one of them), for the out-of-line functions that instantiate them. */
#define DISPATCH_K23(type, CALL)                                                                                    \
    if ((type) == WEIGHTS_Q2_K) {                                                                                   \
        CALL(WEIGHTS_Q2_K);                                                                                         \
    } else {                                                                                                        \
        CALL(WEIGHTS_Q3_K);                                                                                         \
    }

/* dequantize_row for Q2_K / Q3_K, out of line. */
__attribute__((noinline)) static void dequantize_row_k23(const uint8_t *row, int32_t type, int64_t k, float *out) {
#define DEQUANTIZE_ROW(T) dequantize_row_t(row, k, out, T)
    DISPATCH_K23(type, DEQUANTIZE_ROW)
#undef DEQUANTIZE_ROW
}

/* Not Q2_K / Q3_K (dequantize_any_row). */
static inline void dequantize_row(const uint8_t *row, int32_t type, int64_t k, float *out) {
#define DEQUANTIZE_ROW(T) dequantize_row_t(row, k, out, T)
    DISPATCH_TYPE(type, DEQUANTIZE_ROW)
#undef DEQUANTIZE_ROW
}

/* A row of any type quant.h reads, as float32: dequantize_row left as it was, Q2_K / Q3_K out of line. */
static inline void dequantize_any_row(const uint8_t *row, int32_t type, int64_t k, float *out) {
    if (is_k23(type))
        dequantize_row_k23(row, type, k, out);
    else
        dequantize_row(row, type, k, out);
}

/* 1 when the kernels read this type with rows of k values: whole blocks (super-blocks), whole vectors of 8. */
static inline int weights_supported(int32_t type, int64_t k) {
    switch (type) {
    case WEIGHTS_Q4_0: case WEIGHTS_Q4_1: case WEIGHTS_Q8_0: case WEIGHTS_Q5_0: case WEIGHTS_Q5_1: return k % QBLOCK == 0;
    case WEIGHTS_Q2_K: case WEIGHTS_Q3_K: case WEIGHTS_Q4_K: case WEIGHTS_Q5_K: case WEIGHTS_Q6_K: return k % QK_K == 0;
    case WEIGHTS_F32: case WEIGHTS_F16: case WEIGHTS_BF16: return k % LANES == 0;
    case WEIGHTS_Q5_0_G16: case WEIGHTS_Q8_0_G16: return Q8_GROUPED_BUILT && k % QBLOCK == 0;
    default: return 0;
    }
}

#endif
