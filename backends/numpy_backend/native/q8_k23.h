/* The fast precision's small steps on Q2_K and Q3_K (quant_k.h's layouts), included by q8_dots.h after q8_k.h:
 * each block of 32 (sub-block s of its super-block) multiplied in integers by a block of 8-bit x, 8 weight rows
 * together, one a lane, as q8_k.h's K-quants. Each half h of a block (16 weights) has its own integer scale
 * sc_h (Q2_K 4 bits, Q3_K 6 bits signed) and, for Q2_K, min mn_h, under the super-block's d (and dmin):
 *   Q2_K, w = d sc_h qw - dmin mn_h:  (d dx) * sum_h(sc_h dot_h) - (dmin dx) * sum_h(mn_h sum_h(qx))
 *   Q3_K, w = d sc_h qw:              (d dx) * sum_h(sc_h dot_h)
 * where dot_h is the half's integer dot product of qw (Q2_K 0..3, Q3_K -4..3) and qx. The sums over the halves
 * are exact in int32 (|sc dot| < 2^19), so a block costs one conversion and one FMA per row of x (Q2_K: two),
 * as Q4_K's: the float operations, in order, are the dots converted, one FMA by d * dx (rounded first), and
 * for Q2_K the mins' FMA by dmin * dx into the second chain, subtracted; the same on AVX2 and NEON.
 *
 * Kept apart from q8_k.h's types: their own scales (K23Lanes, not KScales) and their own out-of-line
 * instantiations (q8_group_k23), so the other types' groups are compiled as they were. */
#ifndef PAGEDSERVE_Q8_K23_H
#define PAGEDSERVE_Q8_K23_H

/* A group's integer scales and mins of one super-block, lane j row j: sc[g][j], mn[g][j] for weights
 * 16 g .. 16 g + 15 (Q3_K: no mins, zeros), and each row's d and dmin. */
typedef struct {
    int32_t sc[16][Q8_GROUP] __attribute__((aligned(32)));
    int32_t mn[16][Q8_GROUP] __attribute__((aligned(32)));
    float d[Q8_GROUP] __attribute__((aligned(32)));
    float dmin[Q8_GROUP] __attribute__((aligned(32)));
} K23Lanes;

static inline int64_t q8_k23_bytes(int32_t type) { return type == WEIGHTS_Q2_K ? Q2_K_BYTES : Q3_K_BYTES; }

/* Super-block sb of the group's rows (past n the last one again), decoded once for its 8 blocks. */
static inline __attribute__((always_inline)) void k23_lanes_of(const uint8_t *const *row, int64_t sb, K23Lanes *l,
                                                               const int32_t type) {
    for (int j = 0; j < Q8_GROUP; j++) {
        const uint8_t *super = row[j] + sb * q8_k23_bytes(type);
        if (type == WEIGHTS_Q2_K) {
            for (int g = 0; g < 16; g++) l->sc[g][j] = super[g] & 15, l->mn[g][j] = super[g] >> 4;
            l->d[j] = half_to_float(load_u16(super + 80)), l->dmin[j] = half_to_float(load_u16(super + 82));
        } else {
            for (int g = 0; g < 16; g++) l->sc[g][j] = q3_k_scale(super + 96, g), l->mn[g][j] = 0;
            l->d[j] = half_to_float(load_u16(super + 108)), l->dmin[j] = 0.0f;
        }
    }
}

/* The sums of qx over each half of a block (Q2_K's mins; exact integers). */
static inline void q8_half_sums(const int8_t *qx, int32_t sums[2]) {
    for (int h = 0; h < 2; h++) {
        int32_t total = 0;
        for (int i = 0; i < 16; i++) total += qx[16 * h + i];
        sums[h] = total;
    }
}

#if defined(Q8_X86)
/* Half h of block s of super-block sb of the group's rows, transposed as q8_group_k_half's: Q2_K's integers
 * (0..3), Q3_K's q - 4 (signed). */
static inline __attribute__((always_inline)) void q8_group_k23_half(const Q8Group *g, int64_t sb, int s, int h,
                                                                   __m256i out[4], const int32_t type) {
    const int64_t super = sb * q8_k23_bytes(type);
    const int64_t low_at = (type == WEIGHTS_Q2_K ? 16 : 32) + 32 * (s / 4) + 16 * h;
    __m256i low[4], mask[4];
    q8_transpose16(g, super + low_at, low);
    if (type == WEIGHTS_Q3_K) q8_transpose16(g, super + 16 * h, mask);
    for (int c = 0; c < 4; c++) {
        out[c] = _mm256_and_si256(bits_to(low[c], 2 * (s % 4), 0), _mm256_set1_epi8(3));
        if (type == WEIGHTS_Q3_K) { /* the mask's bit s to bit 2; then q - 4 */
            out[c] = _mm256_or_si256(out[c], _mm256_and_si256(bits_to(mask[c], s, 2), _mm256_set1_epi8(4)));
            out[c] = _mm256_sub_epi8(out[c], _mm256_set1_epi8(4));
        }
    }
}

static inline __m256i k23_lane_ints(const int32_t lanes[Q8_GROUP]) { return _mm256_load_si256((const __m256i *)lanes); }

/* sum_h(sc_h dot_h) of block s with row i of x's 32 values at qx, one lane a row (exact in int32). */
static inline __attribute__((always_inline)) __m256i q8_k23_dots(const __m256i lo[4], const __m256i hi[4],
                                                                 const int8_t *qx, const K23Lanes *l, int s,
                                                                 int sign) {
    const __m256i first = _mm256_mullo_epi32(q8_half_dots(lo, qx, sign), k23_lane_ints(l->sc[2 * s]));
    const __m256i second = _mm256_mullo_epi32(q8_half_dots(hi, qx + 16, sign), k23_lane_ints(l->sc[2 * s + 1]));
    return _mm256_add_epi32(first, second);
}

/* Q2_K: sum_h(mn_h sum_h(qx)) of block s, one lane a row (exact in int32). */
static inline __m256i q8_k23_mins(const int8_t *qx, const K23Lanes *l, int s) {
    int32_t sums[2];
    q8_half_sums(qx, sums);
    const __m256i first = _mm256_mullo_epi32(k23_lane_ints(l->mn[2 * s]), _mm256_set1_epi32(sums[0]));
    return _mm256_add_epi32(first, _mm256_mullo_epi32(k23_lane_ints(l->mn[2 * s + 1]), _mm256_set1_epi32(sums[1])));
}

/* Block s of super-block sb for `rows` rows of x (this header's arithmetic), into acc and mins. */
static inline __attribute__((always_inline)) void q8_group_k23_block(const Q8Rows *x, const Q8Group *g,
                                                                    const K23Lanes *l, int64_t blocks, int64_t sb,
                                                                    int s, __m256 acc[Q8_CHUNK], __m256 mins[Q8_CHUNK],
                                                                    const int rows, const int32_t type) {
    __m256i lo[4], hi[4];
    q8_group_k23_half(g, sb, s, 0, lo, type);
    q8_group_k23_half(g, sb, s, 1, hi, type);
    for (int i = 0; i < rows; i++) {
        const int64_t at = i * blocks + 8 * sb + s;
        const int8_t *qx = x->q + at * QBLOCK;
        const __m256 dx = _mm256_set1_ps(x->d[at]);
        const __m256i dots = q8_k23_dots(lo, hi, qx, l, s, type == WEIGHTS_Q3_K);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(_mm256_load_ps(l->d), dx), acc[i]);
        if (type == WEIGHTS_Q2_K) {
            const __m256 m = _mm256_cvtepi32_ps(q8_k23_mins(qx, l, s));
            mins[i] = _mm256_fnmadd_ps(m, _mm256_mul_ps(_mm256_load_ps(l->dmin), dx), mins[i]);
        }
    }
}

/* q8_group_t for Q2_K / Q3_K. */
static inline __attribute__((always_inline)) void q8_group_k23_t(const Q8Rows *x, const Weights *w, float *y,
                                                                int64_t k, int64_t n, int64_t first, int add,
                                                                const int rows, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const Q8Group g = q8_group(w, n, first);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    __m256 acc[Q8_CHUNK], mins[Q8_CHUNK];
    for (int i = 0; i < rows; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    K23Lanes l;
    for (int64_t sb = 0; sb < blocks / 8; sb++) {
        k23_lanes_of(g.row, sb, &l, type);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            ahead_step(&ahead);
            q8_group_k23_block(x, &g, &l, blocks, sb, s, acc, mins, rows, type);
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#else
/* Half h of block s of a super-block `super` of one row: Q2_K's integers (0..3), Q3_K's q - 4. (A shift by a
 * negative count is a right shift, as in q8_k_half.) */
static inline __attribute__((always_inline)) int8x16_t q8_k23_half(const uint8_t *super, int s, int h,
                                                                   const int32_t type) {
    const uint8x16_t low = vld1q_u8(super + (type == WEIGHTS_Q2_K ? 16 : 32) + 32 * (s / 4) + 16 * h);
    uint8x16_t q = vandq_u8(vshlq_u8(low, vdupq_n_s8((int8_t)(-2 * (s % 4)))), vdupq_n_u8(3));
    if (type == WEIGHTS_Q3_K) {
        const uint8x16_t mask = vshlq_u8(vld1q_u8(super + 16 * h), vdupq_n_s8((int8_t)(2 - s)));
        q = vsubq_u8(vorrq_u8(q, vandq_u8(mask, vdupq_n_u8(4))), vdupq_n_u8(4));
    }
    return vreinterpretq_s8_u8(q);
}

/* Block s of super-block sb for `rows` rows of x, lanes rows 4 h .. 4 h + 3 of the group in [h]: AVX2's
 * q8_group_k23_block, operation for operation. */
static inline __attribute__((always_inline)) void q8_k23_block(const Q8Rows *x, const uint8_t *const *row,
                                                              const K23Lanes *l, int64_t blocks, int64_t sb, int s,
                                                              float32x4_t acc[3][2], float32x4_t mins[3][2],
                                                              const int rows, const int32_t type) {
    int8x16_t lo[Q8_GROUP], hi[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) {
        lo[j] = q8_k23_half(row[j] + sb * q8_k23_bytes(type), s, 0, type);
        hi[j] = q8_k23_half(row[j] + sb * q8_k23_bytes(type), s, 1, type);
    }
    for (int i = 0; i < rows; i++) {
        const int64_t at = i * blocks + 8 * sb + s;
        const int8x16_t xlo = vld1q_s8(x->q + at * QBLOCK), xhi = vld1q_s8(x->q + at * QBLOCK + 16);
        int32_t sums[2];
        if (type == WEIGHTS_Q2_K) q8_half_sums(x->q + at * QBLOCK, sums);
        for (int h = 0; h < 2; h++) {
            const int32x4_t first = vmulq_s32(q8_half_dots4(lo + 4 * h, xlo), vld1q_s32(l->sc[2 * s] + 4 * h));
            const int32x4_t second = q8_half_dots4(hi + 4 * h, xhi);
            const int32x4_t dots = vmlaq_s32(first, second, vld1q_s32(l->sc[2 * s + 1] + 4 * h));
            const float32x4_t d = vmulq_n_f32(vld1q_f32(l->d + 4 * h), x->d[at]);
            acc[i][h] = vfmaq_f32(acc[i][h], vcvtq_f32_s32(dots), d);
            if (type == WEIGHTS_Q2_K) {
                const int32x4_t low = vmulq_n_s32(vld1q_s32(l->mn[2 * s] + 4 * h), sums[0]);
                const int32x4_t m = vmlaq_n_s32(low, vld1q_s32(l->mn[2 * s + 1] + 4 * h), sums[1]);
                const float32x4_t dmin = vmulq_n_f32(vld1q_f32(l->dmin + 4 * h), x->d[at]);
                mins[i][h] = vfmsq_f32(mins[i][h], vcvtq_f32_s32(m), dmin);
            }
        }
    }
}

/* q8_group_t for Q2_K / Q3_K. */
static inline __attribute__((always_inline)) void q8_group_k23_t(const Q8Rows *x, const Weights *w, float *y,
                                                                int64_t k, int64_t n, int64_t first, int add,
                                                                const int rows, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    const uint8_t *row[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) row[j] = weights_row(w, first + j < n ? first + j : n - 1);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_GROUP, Q8_GROUP, blocks);
    float32x4_t acc[3][2], mins[3][2];
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 2; h++) acc[i][h] = mins[i][h] = vdupq_n_f32(0.0f);
    K23Lanes l;
    for (int64_t sb = 0; sb < blocks / 8; sb++) {
        k23_lanes_of(row, sb, &l, type);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            ahead_step(&ahead);
            q8_k23_block(x, row, &l, blocks, sb, s, acc, mins, rows, type);
        }
    }
    q8_group_store(acc, mins, rows, y, n, first, add);
}
#endif

/* One group of a Q2_K / Q3_K matrix for every row of x (1..3), in place of q8_group_of: out of line, apart
 * from its instantiations of the other types. */
#if Q8_CHUNK > 3
#define Q8_K23_WIDE(T)                                                                                               \
    case 6: q8_group_k23_t(x, w, y, k, n, first, add, 6, T); break;                                                 \
    case 5: q8_group_k23_t(x, w, y, k, n, first, add, 5, T); break;                                                 \
    case 4: q8_group_k23_t(x, w, y, k, n, first, add, 4, T); break;
#else
#define Q8_K23_WIDE(T)
#endif

__attribute__((noinline)) static void q8_group_k23(const Q8Rows *x, const Weights *w, float *y, int64_t m,
                                                   int64_t k, int64_t n, int64_t first, int add) {
#define Q8_K23_ROWS(T)                                                                                              \
    switch (m) {                                                                                                    \
    Q8_K23_WIDE(T)                                                                                                  \
    case 3: q8_group_k23_t(x, w, y, k, n, first, add, 3, T); break;                                                 \
    case 2: q8_group_k23_t(x, w, y, k, n, first, add, 2, T); break;                                                 \
    default: q8_group_k23_t(x, w, y, k, n, first, add, 1, T); break;                                               \
    }
    DISPATCH_K23(w->type, Q8_K23_ROWS)
#undef Q8_K23_ROWS
}

#endif
