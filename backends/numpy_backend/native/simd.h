/* SIMD helpers shared by the CPU kernels: 8-float vectors (GCC vector extensions, so any target compiles
 * them; -march=native picks the instructions) and their horizontal sums. */
#ifndef PAGEDSERVE_SIMD_H
#define PAGEDSERVE_SIMD_H

typedef float vec8 __attribute__((vector_size(32), aligned(4))); /* 8 floats, unaligned loads allowed */
#define LANES 8

/* Sum of the lanes as a tree: a sequential sum would chain 8 dependent adds. */
static inline float hsum(vec8 v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
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
#else
static inline vec8 hsum8(const vec8 *v) {
    vec8 r;
    for (int j = 0; j < LANES; j++) r[j] = hsum(v[j]);
    return r;
}
#endif

#endif
