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

/* a * b + c. An explicit fused multiply-add where the CPU has one: left to itself, GCC contracts some of the
 * kernels' `acc += x * w` into FMAs and not others, and the two round differently. */
#if defined(__FMA__)
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
#if defined(__AVX__)
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
