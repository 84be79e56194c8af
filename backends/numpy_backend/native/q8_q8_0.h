/* The fast precision's 8-bit path for Q8_0 weights (q8_dots.h's groups of 8 weight rows, one a lane): a block is
 * its scale dw (float16) and 32 signed bytes qw, so w = dw * qw and
 *   y += dw * dx * sum(qw * qx)
 * with no offset term, as llama.cpp's CPU backend multiplies Q8_0 by 8-bit x. The integer products take the
 * unsigned operand that x86's instructions want in two ways, both exact:
 *   VNNI (vpdpbusd): qw + 128 (the sign bit flipped), its chain started at -128 * sum(qx) of the row's block;
 *   AVX2 (pmaddubsw): |qw| against qx with qw's sign (psignb), so a pair of products stays below 2^15.
 * AArch64's sdot multiplies signed bytes as they are. Every tier then does the same float operations in the same
 * order: the dots converted, one FMA by dw * dx (rounded first). Gemma 3's output head is Q8_0 (168 M weights
 * of its 270 M): exact, a batch-1 step spent 16 of its 26 ms of CPU there (amx tier, one thread).
 */
#ifndef PAGEDSERVE_Q8_Q8_0_H
#define PAGEDSERVE_Q8_Q8_0_H

#define Q8_0_BYTES 34 /* d (float16), then the 32 weights in order */

#if defined(Q8_X86)
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define Q8_0_UNSIGNED 1 /* the weights flipped to unsigned, their offset taken back from the chain */
#else
#define Q8_0_UNSIGNED 0
#endif

/* Block b of the group's rows, transposed: lane j of lo[c] holds row j's weights 4c .. 4c + 3, of hi[c] its
 * weights 16 + 4c .. 19 + 4c (with VNNI, each + 128). */
static inline __attribute__((always_inline)) void q8_0_group_weights(const Q8Group *g, int64_t b, __m256i lo[4],
                                                                    __m256i hi[4]) {
    q8_transpose16(g, b * Q8_0_BYTES + 2, lo);
    q8_transpose16(g, b * Q8_0_BYTES + 18, hi);
#if Q8_0_UNSIGNED
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int c = 0; c < 4; c++) lo[c] = _mm256_xor_si256(lo[c], flip), hi[c] = _mm256_xor_si256(hi[c], flip);
#endif
}

/* acc + the 8 int32 sums of 4 products each of w (+ 128 with VNNI) and x. (|qw| <= 128 and |qx| <= 127: a pair
 * of pmaddubsw's products stays below 2^15.) */
static inline __m256i q8_0_dot_add(__m256i acc, __m256i w, __m256i x) {
#if Q8_0_UNSIGNED
    return dot_u8s8_add(acc, w, x);
#else
    return dot_s8s8_add(acc, w, x); /* q8_k.h's: |w| against x with w's sign */
#endif
}

/* The integer dot product of a row of x's block (qx, its sum(qx) `sum`) with the group's rows, a lane a row. */
static inline __attribute__((always_inline)) __m256i q8_0_group_dots(const __m256i lo[4], const __m256i hi[4],
                                                                    const int8_t *qx, int32_t sum) {
    __m256i even = _mm256_set1_epi32(Q8_0_UNSIGNED ? -128 * sum : 0), odd = _mm256_setzero_si256();
    (void)sum;
    for (int c = 0; c < 4; c++) {
        even = q8_0_dot_add(even, lo[c], q8_x_word(qx + 4 * c));
        odd = q8_0_dot_add(odd, hi[c], q8_x_word(qx + 16 + 4 * c));
    }
    return _mm256_add_epi32(even, odd);
}

/* q8_group_t for Q8_0: y[i, first + j] (+)= row i of x . weight row first + j for `rows` rows of x. */
static inline __attribute__((always_inline)) void q8_group_q8_0_t(const Q8Rows *x, const Weights *w, float *y,
                                                                 int64_t k, int64_t n, int64_t first, int add,
                                                                 const int rows, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const Q8Group g = q8_group(w, n, first);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    __m256 acc[Q8_CHUNK], none[Q8_CHUNK];
    for (int i = 0; i < rows; i++) acc[i] = none[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        __m256 d, unused;
        __m256i lo[4], hi[4];
        q8_group_scales(&g, b, &d, &unused, type);
        q8_0_group_weights(&g, b, lo, hi);
        for (int i = 0; i < rows; i++) {
            const int64_t at = i * blocks + b;
            const __m256i dots = q8_0_group_dots(lo, hi, x->q + at * QBLOCK, x->n[at]);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d, _mm256_set1_ps(x->d[at])), acc[i]);
        }
    }
    q8_group_store(acc, none, rows, y, n, first, add);
}
#else
/* The same with NEON: sdot takes the signed weights as stored; the float operations are AVX2's. */
static inline __attribute__((always_inline)) void q8_group_q8_0_t(const Q8Rows *x, const Weights *w, float *y,
                                                                 int64_t k, int64_t n, int64_t first, int add,
                                                                 const int rows, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const uint8_t *row[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) row[j] = weights_row(w, first + j < n ? first + j : n - 1);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    float32x4_t acc[3][2], none[3][2];
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 2; h++) acc[i][h] = none[i][h] = vdupq_n_f32(0.0f);
    (void)type;
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        const float32x4_t d[2] = {q8_scales4(row, b * Q8_0_BYTES), q8_scales4(row + 4, b * Q8_0_BYTES)};
        int8x16_t lo[Q8_GROUP], hi[Q8_GROUP];
        for (int j = 0; j < Q8_GROUP; j++) {
            lo[j] = vld1q_s8((const int8_t *)row[j] + b * Q8_0_BYTES + 2);
            hi[j] = vld1q_s8((const int8_t *)row[j] + b * Q8_0_BYTES + 18);
        }
        for (int i = 0; i < rows; i++) {
            const int64_t at = i * blocks + b;
            const int8x16_t xlo = vld1q_s8(x->q + at * QBLOCK), xhi = vld1q_s8(x->q + at * QBLOCK + 16);
            for (int h = 0; h < 2; h++) {
                const float32x4_t dots = vcvtq_f32_s32(q8_dots4(lo + 4 * h, hi + 4 * h, xlo, xhi));
                acc[i][h] = vfmaq_f32(acc[i][h], dots, vmulq_n_f32(d[h], x->d[at]));
            }
        }
    }
    q8_group_store(acc, none, rows, y, n, first, add);
}
#endif

#endif
