/* SIMD helpers shared by the CPU kernels: 8-float vectors (GCC vector extensions, so any target compiles
 * them; -march=native picks the instructions) and their horizontal sums. */
#ifndef PAGEDSERVE_SIMD_H
#define PAGEDSERVE_SIMD_H

typedef float vec8 __attribute__((vector_size(32), aligned(4))); /* 8 floats, unaligned loads allowed */
#define LANES 8

/* The kernels' software prefetches go to L2 (locality 1). Into L1 as well, they crowd its few miss buffers and
 * evict what the arithmetic is using: a batch-64 step's attention took about 5 ms longer, and the projections
 * of a batch-8 step were no faster than with no prefetch at all. */
#define PREFETCH_LOCALITY 1

/* Sum of the lanes as a tree: a sequential sum would chain 8 dependent adds. */
static inline float hsum(vec8 v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

#if defined(__aarch64__) && defined(__ARM_NEON)
#define SIMD_NEON 1
#include <arm_neon.h>

/* A vec8 as NEON holds it: lanes 0-3 and 4-7 in two registers. AArch64 has no 32-byte registers, and GCC keeps a
 * vec8 that lives across a loop's iterations in memory, storing and reloading it every iteration; the NEON loops
 * keep their accumulators as pairs instead, and unroll their loops over them fully (#pragma GCC unroll), which
 * keeps even arrays of pairs in registers. */
typedef struct {
    float32x4_t lo, hi;
} pair8;

typedef union {
    vec8 v;
    pair8 p;
} vec8_pair;

static inline pair8 pair_of(vec8 v) {
    vec8_pair u;
    u.v = v;
    return u.p;
}

static inline vec8 vec8_of(pair8 p) {
    vec8_pair u;
    u.p = p;
    return u.v;
}

static inline pair8 load_pair(const void *p) {
    return (pair8){vld1q_f32((const float *)p), vld1q_f32((const float *)p + 4)};
}

static inline void store_pair(void *p, pair8 v) {
    vst1q_f32((float *)p, v.lo);
    vst1q_f32((float *)p + 4, v.hi);
}

static inline pair8 zero_pair(void) { return (pair8){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }

static inline pair8 broadcast_pair(float f) { return (pair8){vdupq_n_f32(f), vdupq_n_f32(f)}; }
#endif

/* a * b + c. An explicit fused multiply-add where the CPU has one: left to itself, GCC contracts some of the
 * kernels' `acc += x * w` into FMAs and not others, and the two round differently. */
#if defined(SIMD_NEON)
/* a * b + c, each lane one fused multiply-add (vfmaq_f32: never left to the compiler's contraction). */
static inline pair8 fma_pair(pair8 a, pair8 b, pair8 c) {
    return (pair8){vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}

static inline vec8 fma8(vec8 a, vec8 b, vec8 c) { return vec8_of(fma_pair(pair_of(a), pair_of(b), pair_of(c))); }
#elif defined(__FMA__)
#include <immintrin.h>
static inline vec8 fma8(vec8 a, vec8 b, vec8 c) { return (vec8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline vec8 fma8(vec8 a, vec8 b, vec8 c) { return a * b + c; }
#endif

/* Sum of the lanes in the order hsum8 adds them, so that a dot product ends in the same float whichever of the
 * two reduces it (the projections give a row the same result whatever else is in the batch). */
static inline float hsum_pairs(vec8 v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* r[j] = the sum of v[j]'s lanes, for 8 vectors at once: a transposing reduction, cheaper than 8 hsums. */
#if defined(SIMD_NEON)
/* NEON's pairwise add (vpaddq_f32: a0 + a1, a2 + a3, b0 + b1, b2 + b3) is hsum_pairs' order, level by level. */
static inline float32x4_t pairwise_sums(pair8 a) { return vpaddq_f32(a.lo, a.hi); } /* the first level */

/* The lane sums of a, b, c and d (lanes 0-3), each in hsum_pairs' order. */
static inline float32x4_t hsum4_pairs(pair8 a, pair8 b, pair8 c, pair8 d) {
    return vpaddq_f32(vpaddq_f32(pairwise_sums(a), pairwise_sums(b)), vpaddq_f32(pairwise_sums(c), pairwise_sums(d)));
}

/* hsum8 of eight pairs (the NEON loops' accumulators). */
static inline vec8 hsum8_pairs(const pair8 *v) {
    return vec8_of((pair8){hsum4_pairs(v[0], v[1], v[2], v[3]), hsum4_pairs(v[4], v[5], v[6], v[7])});
}

/* hsum of one pair, in its tree order: (v0 + v4, v1 + v5, v2 + v6, v3 + v7), then lanes 0 + 2 and 1 + 3. */
static inline float hsum_tree_pair(pair8 a) {
    const float32x4_t t = vaddq_f32(a.lo, a.hi);
    return vpadds_f32(vadd_f32(vget_low_f32(t), vget_high_f32(t)));
}

/* hsum_pairs of one pair. */
static inline float hsum_pair(pair8 a) {
    const float32x4_t s = pairwise_sums(a);
    return vpadds_f32(vget_low_f32(vpaddq_f32(s, s)));
}

static inline vec8 hsum8(const vec8 *v) {
    pair8 p[LANES];
    for (int j = 0; j < LANES; j++) p[j] = pair_of(v[j]);
    return hsum8_pairs(p);
}

static inline void hsum4(vec8 a, vec8 b, vec8 c, vec8 d, float *out) {
    vst1q_f32(out, hsum4_pairs(pair_of(a), pair_of(b), pair_of(c), pair_of(d)));
}
#elif defined(__AVX__)
#include <immintrin.h>
static inline vec8 hsum8(const vec8 *v) {
    const __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps((__m256)v[0], (__m256)v[1]),
                                     _mm256_hadd_ps((__m256)v[2], (__m256)v[3]));
    const __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps((__m256)v[4], (__m256)v[5]),
                                     _mm256_hadd_ps((__m256)v[6], (__m256)v[7]));
    return (vec8)_mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

/* The lane sums of a, b, c, d (in hsum_pairs' order): one row of x against a strip of weight rows. */
static inline void hsum4(vec8 a, vec8 b, vec8 c, vec8 d, float *out) {
    const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps((__m256)a, (__m256)b), _mm256_hadd_ps((__m256)c, (__m256)d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
}
#else
static inline void hsum4(vec8 a, vec8 b, vec8 c, vec8 d, float *out) {
    out[0] = hsum_pairs(a), out[1] = hsum_pairs(b), out[2] = hsum_pairs(c), out[3] = hsum_pairs(d);
}

static inline vec8 hsum8(const vec8 *v) {
    vec8 r;
    for (int j = 0; j < LANES; j++) r[j] = hsum_pairs(v[j]);
    return r;
}
#endif

#endif
