/* The pieces of a softmax shared by attention and sampling: the largest of a row, and exp of the (non-positive)
 * differences from it, 8 lanes at a time. */
#ifndef PAGEDSERVE_SOFTMAX_H
#define PAGEDSERVE_SOFTMAX_H

#include <math.h>
#include <stdint.h>

#include "simd.h"

typedef int32_t vec8i __attribute__((vector_size(32)));

/* exp for x <= 0 (softmax arguments), to float32 precision: 2^n * exp(r), |r| <= ln2 / 2, with a degree-6
 * Taylor polynomial (error below 2e-7 relative). Arguments below -87 give about 1e-38 instead of less. */
static vec8 exp_nonpositive(vec8 x) {
    const vec8 shifter = x * 0.0f + 12582912.0f; /* adding and subtracting 1.5 * 2^23 rounds to an integer */
    for (int i = 0; i < LANES; i++) x[i] = x[i] < -87.0f ? -87.0f : x[i];
    const vec8 n = (x * 1.44269504f + shifter) - shifter;
    const vec8 r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    vec8 p = r * (1.0f / 720) + 1.0f / 120;
    p = (((((p * r + 1.0f / 24) * r + 1.0f / 6) * r + 0.5f) * r + 1.0f) * r) + 1.0f;
    const vec8i bits = (__builtin_convertvector(n, vec8i) + 127) << 23;
    vec8 scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The largest of n finite scores, 8 lanes at a time: one by one, each compare waited on the last (a batch-64
 * step spent milliseconds there). The max of finite floats is exact in any order. */
static float max_score(const float *scores, int64_t n) {
    vec8 tops = (vec8){0} - INFINITY; /* from -inf, not scores[0]: a NaN there would win (nothing compares above it) */
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const vec8 v = *(const vec8 *)(scores + i);
        const vec8i above = v > tops; /* all ones where v is larger */
        tops = (vec8)(((vec8i)v & above) | ((vec8i)tops & ~above));
    }
    float top = -INFINITY;
    for (int j = 0; j < LANES; j++) top = tops[j] > top ? tops[j] : top;
    for (; i < n; i++) top = scores[i] > top ? scores[i] : top;
    return top;
}

#endif
