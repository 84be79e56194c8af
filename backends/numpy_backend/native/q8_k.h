/* The fast precision's small steps on the K-quants (Q4_K, Q5_K, Q6_K; quant_k.h's layouts), included by
 * q8_dots.h: each block of 32 (sub-block s of its super-block) multiplied in integers by a block of 8-bit x, as
 * q8_dots.h's types, 8 weight rows together, one a lane:
 *   Q4_K, Q5_K, w = D * qw - M (D = d * sc, M = dmin * mn):  D * dx * sum(qw * qx) - M * sx
 *   Q6_K, w = D_h * (qw - 32), D_h = d * scale of half h:    D_0 * dx * sum_0 + D_1 * dx * sum_1
 * where sum_h is the sum of (qw - 32) * qx over the block's weights 16 h .. 16 h + 15 (two scales a block).
 * Each super-block's D and M are decoded once per row (k_scales_of), and the loop over its 8 blocks is unrolled,
 * so each block's nibble, fifth bit and shifts are constants. The float operations, in order: dots converted
 * (exact: |sum| < 2^24), one FMA by D * dx (rounded first), then -M * sx into the second chain (Q6_K: a second
 * FMA for the block's second half instead); the same on AVX2 and NEON, so the same floats. */
#ifndef PAGEDSERVE_Q8_K_H
#define PAGEDSERVE_Q8_K_H

static inline int64_t q8_super_bytes(int32_t type) {
    return type == WEIGHTS_Q4_K ? Q4_K_BYTES : type == WEIGHTS_Q5_K ? Q5_K_BYTES : Q6_K_BYTES;
}

/* Where sub-block s's low bits (ql, qs: 32 bytes, nibble `high`) and high bits (qh: 32 bytes, bit hbit of each)
 * lie in a super-block; no high bits for Q4_K. */
typedef struct {
    int64_t low, high;
    int nibble, hbit;
} KBits;

static inline KBits k_bits(int s, int32_t type) {
    if (type == WEIGHTS_Q6_K) return (KBits){64 * (s / 4) + 32 * (s % 2), 128 + 32 * (s / 4), s % 4 / 2, 2 * (s % 4)};
    return (KBits){(type == WEIGHTS_Q5_K ? 48 : 16) + 32 * (s / 2), 16, s % 2, s};
}

#if defined(Q8_X86)
/* The group's super-block sb's scales, float i of row j's KScales (d[i], or m[i - 16]) at lanes[i][j]: read
 * back by one plain load a block (gathering them, a block's scales cost Q4_K's rate 12.2 -> 13.9 Gweights/s). */
static inline __attribute__((always_inline)) void q8_group_k_scales(const Q8Group *g, int64_t sb,
                                                                   float lanes[24][Q8_GROUP], const int32_t type) {
    for (int j = 0; j < Q8_GROUP; j++) {
        KScales ks;
        k_scales_of(g->row[j], type, sb, &ks);
        const float *f = (const float *)&ks;
        for (int i = 0; i < (type == WEIGHTS_Q6_K ? 16 : 24); i++) lanes[i][j] = f[i];
    }
}

static inline __m256 q8_k_lanes(const float lanes[24][Q8_GROUP], int i) { return _mm256_loadu_ps(lanes[i]); }

/* Half h (weights 16 h .. 16 h + 15) of block s of super-block sb of the group's rows, transposed as
 * q8_group_weights': Q4_K / Q5_K's integers (0..31), Q6_K's q - 32 (signed). */
static inline __attribute__((always_inline)) void q8_group_k_half(const Q8Group *g, int64_t sb, int s, int h,
                                                                 __m256i out[4], const int32_t type) {
    const KBits at = k_bits(s, type);
    const int64_t super = sb * q8_super_bytes(type);
    __m256i low[4], high[4];
    q8_transpose16(g, super + at.low + 16 * h, low);
    if (type != WEIGHTS_Q4_K) q8_transpose16(g, super + at.high + 16 * h, high);
    for (int c = 0; c < 4; c++) {
        out[c] = _mm256_and_si256(at.nibble ? _mm256_srli_epi16(low[c], 4) : low[c], _mm256_set1_epi8(0x0f));
        if (type == WEIGHTS_Q5_K) /* bit s to bit 4 */
            out[c] = _mm256_or_si256(out[c], _mm256_and_si256(bits_to(high[c], at.hbit, 4), _mm256_set1_epi8(0x10)));
        if (type == WEIGHTS_Q6_K) { /* bits 2t, 2t + 1 to bits 4, 5; then q - 32 */
            out[c] = _mm256_or_si256(out[c], _mm256_and_si256(bits_to(high[c], at.hbit, 4), _mm256_set1_epi8(0x30)));
            out[c] = _mm256_sub_epi8(out[c], _mm256_set1_epi8(32));
        }
    }
}

/* One half's integer dot products with row i of x's 16 values at qx, one lane a row. */
static inline __attribute__((always_inline)) __m256i q8_half_dots(const __m256i w[4], const int8_t *qx, int sign) {
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++)
        sum = sign ? dot_s8s8_add(sum, w[c], q8_x_word(qx + 4 * c)) : dot_u8s8_add(sum, w[c], q8_x_word(qx + 4 * c));
    return sum;
}

/* Block s of super-block sb for `rows` rows of x (q8_k.h's arithmetic), into acc and mins. */
static inline __attribute__((always_inline)) void q8_group_k_block(const Q8Rows *x, const Q8Group *g,
                                                                  const float ks[24][Q8_GROUP], int64_t blocks,
                                                                  int64_t sb, int s, __m256 acc[Q8_CHUNK], __m256 mins[Q8_CHUNK],
                                                                  const int rows, const int32_t type) {
    __m256i lo[4], hi[4];
    q8_group_k_half(g, sb, s, 0, lo, type);
    q8_group_k_half(g, sb, s, 1, hi, type);
    for (int i = 0; i < rows; i++) {
        const int64_t at = i * blocks + 8 * sb + s;
        const int8_t *qx = x->q + at * QBLOCK;
        if (type == WEIGHTS_Q6_K) {
            for (int h = 0; h < 2; h++) {
                const __m256 d = _mm256_mul_ps(q8_k_lanes(ks, 2 * s + h), _mm256_set1_ps(x->d[at]));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_half_dots(h ? hi : lo, qx + 16 * h, 1)), d, acc[i]);
            }
        } else {
            const __m256i dots = _mm256_add_epi32(q8_half_dots(lo, qx, 0), q8_half_dots(hi, qx + 16, 0));
            const __m256 m = _mm256_xor_ps(q8_k_lanes(ks, 16 + s), _mm256_set1_ps(-0.0f)); /* -M, exact */
            q8_scale_add(dots, q8_k_lanes(ks, s), m, x, at, &acc[i], &mins[i], 1);
        }
    }
}

/* q8_group_t for the K-quants. */
static inline __attribute__((always_inline)) void q8_group_k_t(const Q8Rows *x, const Weights *w, float *y, int64_t k,
                                                              int64_t n, int64_t first, int add, const int rows,
                                                              const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const Q8Group g = q8_group(w, n, first);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    __m256 acc[Q8_CHUNK], mins[Q8_CHUNK];
    for (int i = 0; i < rows; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    float ks[24][Q8_GROUP];
    for (int64_t sb = 0; sb < blocks / 8; sb++) {
        q8_group_k_scales(&g, sb, ks, type);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            ahead_step(&ahead);
            q8_group_k_block(x, &g, ks, blocks, sb, s, acc, mins, rows, type);
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#else
/* Half h of block s of a super-block `super` of one row: Q4_K / Q5_K's integers (0..31), Q6_K's q - 32. (A
 * shift by a negative count is a right shift: vshlq_u8 brings bit hbit to bit 4 either way.) */
static inline __attribute__((always_inline)) int8x16_t q8_k_half(const uint8_t *super, int s, int h,
                                                                 const int32_t type) {
    const KBits at = k_bits(s, type);
    const uint8x16_t low = vld1q_u8(super + at.low + 16 * h);
    uint8x16_t q = at.nibble ? vshrq_n_u8(low, 4) : vandq_u8(low, vdupq_n_u8(0x0f));
    if (type != WEIGHTS_Q4_K) {
        const uint8x16_t high = vshlq_u8(vld1q_u8(super + at.high + 16 * h), vdupq_n_s8((int8_t)(4 - at.hbit)));
        q = vorrq_u8(q, vandq_u8(high, vdupq_n_u8(type == WEIGHTS_Q5_K ? 0x10 : 0x30)));
    }
    if (type == WEIGHTS_Q6_K) q = vsubq_u8(q, vdupq_n_u8(32));
    return vreinterpretq_s8_u8(q);
}

/* Float i of four rows' KScales (d[i], or m[i - 16]). */
static inline float32x4_t q8_k_lanes4(const KScales *ks, int i) {
    const float *f[4] = {(const float *)&ks[0], (const float *)&ks[1], (const float *)&ks[2], (const float *)&ks[3]};
    return (float32x4_t){f[0][i], f[1][i], f[2][i], f[3][i]};
}

/* One half's integer dot products of four rows with x's 16 values, one lane a row. */
static inline __attribute__((always_inline)) int32x4_t q8_half_dots4(const int8x16_t *w, int8x16_t x) {
    int32x4_t part[4];
    for (int j = 0; j < 4; j++) part[j] = vdotq_s32(vdupq_n_s32(0), w[j], x);
    return vpaddq_s32(vpaddq_s32(part[0], part[1]), vpaddq_s32(part[2], part[3]));
}

/* Block s of super-block sb for `rows` rows of x, lanes rows 4 h .. 4 h + 3 of the group in [h]: AVX2's
 * q8_group_k_block, operation for operation. */
static inline __attribute__((always_inline)) void q8_k_block(const Q8Rows *x, const uint8_t *const *row,
                                                            const KScales *ks, int64_t blocks, int64_t sb, int s,
                                                            float32x4_t acc[3][2], float32x4_t mins[3][2],
                                                            const int rows, const int32_t type) {
    int8x16_t lo[Q8_GROUP], hi[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) {
        lo[j] = q8_k_half(row[j] + sb * q8_super_bytes(type), s, 0, type);
        hi[j] = q8_k_half(row[j] + sb * q8_super_bytes(type), s, 1, type);
    }
    for (int i = 0; i < rows; i++) {
        const int64_t at = i * blocks + 8 * sb + s;
        const int8x16_t xlo = vld1q_s8(x->q + at * QBLOCK), xhi = vld1q_s8(x->q + at * QBLOCK + 16);
        for (int h = 0; h < 2; h++) {
            if (type == WEIGHTS_Q6_K) {
                for (int half = 0; half < 2; half++) {
                    const int32x4_t dots = q8_half_dots4((half ? hi : lo) + 4 * h, half ? xhi : xlo);
                    const float32x4_t d = vmulq_n_f32(q8_k_lanes4(ks + 4 * h, 2 * s + half), x->d[at]);
                    acc[i][h] = vfmaq_f32(acc[i][h], vcvtq_f32_s32(dots), d);
                }
            } else {
                const int32x4_t dots = vaddq_s32(q8_half_dots4(lo + 4 * h, xlo), q8_half_dots4(hi + 4 * h, xhi));
                const float32x4_t d = vmulq_n_f32(q8_k_lanes4(ks + 4 * h, s), x->d[at]);
                acc[i][h] = vfmaq_f32(acc[i][h], vcvtq_f32_s32(dots), d);
                mins[i][h] = vfmaq_n_f32(mins[i][h], vnegq_f32(q8_k_lanes4(ks + 4 * h, 16 + s)), x->s[at]);
            }
        }
    }
}

/* q8_group_t for the K-quants. */
static inline __attribute__((always_inline)) void q8_group_k_t(const Q8Rows *x, const Weights *w, float *y, int64_t k,
                                                              int64_t n, int64_t first, int add, const int rows,
                                                              const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const uint8_t *row[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) row[j] = weights_row(w, first + j < n ? first + j : n - 1);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    float32x4_t acc[3][2], mins[3][2];
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 2; h++) acc[i][h] = mins[i][h] = vdupq_n_f32(0.0f);
    KScales ks[Q8_GROUP];
    for (int64_t sb = 0; sb < blocks / 8; sb++) {
        for (int j = 0; j < Q8_GROUP; j++) k_scales_of(row[j], type, sb, &ks[j]);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            ahead_step(&ahead);
            q8_k_block(x, row, ks, blocks, sb, s, acc, mins, rows, type);
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#endif

#endif
