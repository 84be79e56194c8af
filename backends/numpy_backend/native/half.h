/* 16-bit floats (IEEE binary16): the GGUF's F16 matrices and block scales, and a KV cache kept in float16.
 * Loads widen exactly; stores round to nearest, ties to even, as NumPy's astype(float16) does (a NaN stays a
 * NaN, its payload aside). F16C, or NEON's vcvt, does eight at a time where the CPU has it; elsewhere the same
 * results one by one. */
#ifndef PAGEDSERVE_HALF_H
#define PAGEDSERVE_HALF_H

#include <stdint.h>
#include <string.h>

#include "simd.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(SIMD_NEON)
    __fp16 v; /* AArch64's storage type for IEEE binary16: widened by one FCVT */
    memcpy(&v, &h, sizeof v);
    return (float)v;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13); /* inf, nan */
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else { /* subnormal: normalize */
        int e = -1;
        uint32_t m = mant;
        do { e++; m <<= 1; } while ((m & 0x400) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

#if !defined(__F16C__)
/* f rounded to the nearest float16, ties to even; past the largest finite one (65504): infinity. */
static inline uint16_t float_to_half(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return sign | 0x7e00; /* nan */
    if (magnitude >= 0x477ff000u) return sign | 0x7c00; /* rounds past 65504, or inf */
    if (magnitude < 0x38800000u) { /* below 2^-14: a subnormal float16 (or zero), in steps of 2^-24 */
        float scaled;
        const uint32_t abs_bits = magnitude;
        memcpy(&scaled, &abs_bits, sizeof scaled);
        scaled *= 16777216.0f; /* exact: a power of two */
        return sign | (uint16_t)__builtin_rintf(scaled); /* rintf: to nearest, ties to even */
    }
    const uint32_t odd = (magnitude >> 13) & 1; /* ties go to the even mantissa */
    return sign | (uint16_t)((magnitude - 0x38000000u + 0xfffu + odd) >> 13);
}
#endif

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#if defined(SIMD_NEON)
/* 4 float16 values from p, widened (vcvt_f32_f16: exact); loaded as bytes, so p needs no alignment. */
static inline float32x4_t widen4_f16(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }

/* 8 float16 values from p as a NEON pair (simd.h). */
static inline pair8 half_pair(const uint8_t *p) { return (pair8){widen4_f16(p), widen4_f16(p + 8)}; }
#endif

/* 8 float16 values from p (exact conversions). */
static inline vec8 deq8_f16(const uint8_t *p) {
#if defined(__F16C__)
    return (vec8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#elif defined(SIMD_NEON)
    return vec8_of(half_pair(p));
#else
    vec8 v;
    for (int i = 0; i < LANES; i++) v[i] = half_to_float(load_u16(p + 2 * i));
    return v;
#endif
}

/* out = n float16 values at p (n a multiple of 8), widened. */
static inline void widen_f16(const uint8_t *p, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += LANES) {
        const vec8 v = deq8_f16(p + 2 * i);
        memcpy(out + i, &v, sizeof v);
    }
}

/* n floats (a multiple of 8) rounded to float16 at p. */
static inline void store_f16(const float *x, int64_t n, uint8_t *p) {
    for (int64_t i = 0; i < n; i += LANES) {
#if defined(__F16C__)
        _mm_storeu_si128((__m128i *)(p + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(SIMD_NEON)
        /* vcvt_f16_f32 rounds as the FPCR says: to nearest, ties to even, unless a program changed it */
        vst1_u8(p + 2 * i, vreinterpret_u8_f16(vcvt_f16_f32(vld1q_f32(x + i))));
        vst1_u8(p + 2 * i + 8, vreinterpret_u8_f16(vcvt_f16_f32(vld1q_f32(x + i + 4))));
#else
        for (int j = 0; j < LANES; j++) {
            const uint16_t h = float_to_half(x[i + j]);
            memcpy(p + 2 * (i + j), &h, sizeof h);
        }
#endif
    }
}

#endif
