/* The fast precision's 8-bit path for steps of Q8_LANES_MIN_ROWS rows or more on Q8_0 and the K-quants (Q4_K,
 * Q5_K, Q6_K), on AVX-512 VNNI: the rows of x in the lanes of a 512-bit vector (16 at a time) instead of the
 * weight rows (q8_dots.h's and q8_k.h's groups).
 *
 * Why: a group of 8 weight rows pays its decoding (8 x 4-byte transposes, masks, a gather of the scales) once
 * per 6 rows of x, and every row of x its own broadcasts, conversion and scaling for 8 weight rows; at 16 rows
 * Gemma 3's output head (262,144 x 640 Q8_0) took as long as the exact kernel (53 ms, one thread). Here x is
 * laid out once per call (each block's 8 words of 4 bytes, lane i row i), a weight row's block (a K-quant's
 * super-block) is decoded once into bytes for 16 rows of x, and each of its words costs one broadcast and one
 * vpdpbusd for all 16. vpdpbusd multiplies unsigned by signed bytes: Q8_0's qw + 128 (its sign bit flipped) and
 * Q6_K's unsigned q, each chain started at minus the offset times sum(qx) (-128 sum over the block, -32 over
 * each half); Q4_K's and Q5_K's integers are unsigned already.
 *
 * Each (x row, weight row) pair does the float operations of the groups in the same order: the block's (Q6_K:
 * half block's) integer dot product (exact) converted, one FMA by its scale * dx, block after block, and
 * Q4_K's / Q5_K's -M * sx into the second chain; then their sum and, with `add`, + y. So a row's result is the
 * same whichever path its step takes, whatever its batch.
 */
#ifndef PAGEDSERVE_Q8_LANES_H
#define PAGEDSERVE_Q8_LANES_H

#if defined(Q8_X86) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define Q8_LANES 1
#define Q8_LANE_ROWS 16     /* rows of x in a vector */
#define Q8_LANES_MIN_ROWS 8 /* fewer rows: the groups of q8_dots.h / q8_k.h (6 rows: even on Gemma's head) */
#define Q8_LANES_GROUP 8    /* weight rows at once: eight chains of vpdpbusd hide its latency */
#define Q8_LANE_VECTORS 13  /* per block: 8 words, dx, sx, and the chains' starts (Q8_0's, Q6_K's two halves') */
enum { LANE_DX = 8, LANE_SX, LANE_START_Q8_0, LANE_START_HALF };

/* The types this path reads. */
static inline int q8_lanes_read(int32_t type) {
    return type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1 || type == WEIGHTS_Q5_0 || type == WEIGHTS_Q5_1 ||
           type == WEIGHTS_Q8_0 || is_k_quant(type);
}

/* Bytes for x in lanes (Q8_LANE_VECTORS vectors of 64 bytes per block for each 16 rows of m), a K-quant group's
 * sums for each 16 rows (2 x 8 vectors), and 64 to align. */
static inline int64_t q8_lanes_bytes(int64_t m, int64_t k) {
    const int64_t chunks = (m + Q8_LANE_ROWS - 1) / Q8_LANE_ROWS;
    return chunks * ((k / QBLOCK) * Q8_LANE_VECTORS + 2 * Q8_LANES_GROUP) * 64 + 64;
}

/* The sum of 16 bytes of qx. */
static inline int32_t q8_sum16(const int8_t *q) {
    int32_t sum = 0;
    for (int i = 0; i < 16; i++) sum += q[i];
    return sum;
}

/* Row i (< 16) of block b's lanes from the rounded x's block `at`. */
static inline void q8_lane_of(const Q8Rows *x, int64_t at, int i, int32_t lanes[Q8_LANE_VECTORS][Q8_LANE_ROWS]) {
    const int8_t *q = x->q + at * QBLOCK;
    for (int c = 0; c < 8; c++) memcpy(&lanes[c][i], q + 4 * c, 4);
    memcpy(&lanes[LANE_DX][i], &x->d[at], 4), memcpy(&lanes[LANE_SX][i], &x->s[at], 4);
    lanes[LANE_START_Q8_0][i] = -128 * x->n[at];                       /* Q8_0's qw + 128 */
    lanes[LANE_START_HALF][i] = -32 * q8_sum16(q);                     /* Q6_K's q, not q - 32 */
    lanes[LANE_START_HALF + 1][i] = -32 * q8_sum16(q + 16);
}

/* Rows first .. first + count - 1 (count <= 16) of the rounded x into `out` (blocks x Q8_LANE_VECTORS vectors):
 * vector c < 8 of block b holds qx[4c .. 4c + 3] of row i as lane i's int32, then dx, sx and the chains' starts;
 * lanes past count are zero (their sums are computed and never stored). */
static void q8_to_lanes(const Q8Rows *x, int64_t first, int count, int64_t blocks, __m512i *out) {
    for (int64_t b = 0; b < blocks; b++) {
        int32_t lanes[Q8_LANE_VECTORS][Q8_LANE_ROWS] __attribute__((aligned(64))) = {{0}};
        for (int i = 0; i < count; i++) q8_lane_of(x, (first + i) * blocks + b, i, lanes);
        for (int v = 0; v < Q8_LANE_VECTORS; v++) out[b * Q8_LANE_VECTORS + v] = _mm512_load_si512(lanes[v]);
    }
}

/* How many of the 16 rows of x in lanes chunk ch holds, of m. */
static inline int q8_lane_count(int64_t m, int64_t ch) {
    return (int)(m - ch * Q8_LANE_ROWS < Q8_LANE_ROWS ? m - ch * Q8_LANE_ROWS : Q8_LANE_ROWS);
}

/* The weight rows first .. first + 7 (past n the last row again, computed and not stored). */
static inline void q8_lane_rows(const Weights *w, int64_t n, int64_t first, const uint8_t *row[Q8_LANES_GROUP]) {
    for (int j = 0; j < Q8_LANES_GROUP; j++) row[j] = weights_row(w, first + j < n ? first + j : n - 1);
}

/* Words c0 .. c0 + count - 1 of each row's 32 weight bytes (wb[j]) against the block's x (xb) into dots[j]:
 * from memory, each broadcast a load alone (the compiler's shuffles of registers instead took the port that
 * vpdpbusd leaves free, two uops a product: 115 cycles a block of 8 rows against 64 for the products). */
static inline __attribute__((always_inline)) void q8_lanes_dots(const uint8_t *const wb[Q8_LANES_GROUP],
                                                               const __m512i *xb, int c0, int count,
                                                               __m512i dots[Q8_LANES_GROUP]) {
    __asm__ volatile("" : : : "memory");
    for (int c = c0; c < c0 + count; c++)
        for (int j = 0; j < Q8_LANES_GROUP; j++) {
            int32_t word;
            memcpy(&word, wb[j] + 4 * c, 4);
            dots[j] = _mm512_dpbusd_epi32(dots[j], _mm512_set1_epi32(word), xb[c]);
        }
}

/* acc[j] += dots[j] * (scale[j] * dx): q8_dots.h's float operations, a lane a row of x. */
static inline __attribute__((always_inline)) void q8_lanes_scale(const __m512i dots[Q8_LANES_GROUP],
                                                                const float scale[Q8_LANES_GROUP], __m512 dx,
                                                                __m512 acc[Q8_LANES_GROUP]) {
    for (int j = 0; j < Q8_LANES_GROUP; j++)
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[j]), _mm512_mul_ps(_mm512_set1_ps(scale[j]), dx), acc[j]);
}

/* Block b of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 row as 32 unsigned bytes in order (the nibbles, Q5's fifth bits
 * from qh above them; Q8_0's signed bytes + 128), its d and its offset m (w = d q + m: Q4_1's and Q5_1's stored
 * m, else -8 d or -16 d; Q8_0 none: its chain starts at -128 sum(qx) instead). */
static inline __attribute__((always_inline)) void q8_lanes_block_decode(const uint8_t *row, int64_t b,
                                                                       uint8_t out[32], float *d, float *m,
                                                                       const int32_t type) {
    const uint8_t *block = row + b * q8_block_bytes(type), *nibbles = block + q8_nibbles_at(type);
    *d = _cvtsh_ss(load_u16(block));
    if (type == WEIGHTS_Q8_0) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 2));
        _mm256_store_si256((__m256i *)out, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));
        *m = 0.0f;
        return;
    }
    *m = q8_has_min(type) ? _cvtsh_ss(load_u16(block + 2)) : *d * q8_offset(type);
    const __m128i packed = _mm_loadu_si128((const __m128i *)nibbles), low = _mm_set1_epi8(0x0f);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    if (q8_five(type)) { /* byte i of q takes bit i of qh: qh's byte i / 8 spread, masked by its bit i % 8 */
        uint32_t qh;
        memcpy(&qh, nibbles - 4, 4);
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                                   _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    _mm256_store_si256((__m256i *)out, q);
}

/* A Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 block b of the 8 rows into acc and mins, as q8_dots.h's q8_group_t. */
static inline __attribute__((always_inline)) void q8_lanes_block(const uint8_t *const row[Q8_LANES_GROUP],
                                                                int64_t b, const __m512i *xb,
                                                                __m512 acc[Q8_LANES_GROUP],
                                                                __m512 mins[Q8_LANES_GROUP], const int32_t type) {
    uint8_t bytes[Q8_LANES_GROUP][32] __attribute__((aligned(32)));
    const uint8_t *wb[Q8_LANES_GROUP];
    __m512i dots[Q8_LANES_GROUP];
    float scale[Q8_LANES_GROUP], offset[Q8_LANES_GROUP];
    for (int j = 0; j < Q8_LANES_GROUP; j++) {
        q8_lanes_block_decode(row[j], b, bytes[j], &scale[j], &offset[j], type);
        wb[j] = bytes[j], dots[j] = type == WEIGHTS_Q8_0 ? xb[LANE_START_Q8_0] : _mm512_setzero_si512();
    }
    q8_lanes_dots(wb, xb, 0, 8, dots);
    q8_lanes_scale(dots, scale, _mm512_castsi512_ps(xb[LANE_DX]), acc);
    if (type == WEIGHTS_Q8_0) return; /* no offset term */
    const __m512 sx = _mm512_castsi512_ps(xb[LANE_SX]);
    for (int j = 0; j < Q8_LANES_GROUP; j++) mins[j] = _mm512_fmadd_ps(_mm512_set1_ps(offset[j]), sx, mins[j]);
}

/* Super-block sb of a K-quant row as 256 unsigned bytes, block s's weights at 32 s (Q4_K 0..15, Q5_K 0..31, Q6_K
 * q = 0..63, its -32 taken back by the chains' starts), and its scales. */
static inline __attribute__((always_inline)) void q8_lanes_k_decode(const uint8_t *row, int64_t sb, uint8_t out[256],
                                                                   KScales *ks, const int32_t type) {
    const uint8_t *super = row + sb * q8_super_bytes(type);
    for (int s = 0; s < 8; s++) {
        const KBits at = k_bits(s, type);
        const __m256i low = _mm256_loadu_si256((const __m256i *)(super + at.low));
        __m256i v = _mm256_and_si256(at.nibble ? _mm256_srli_epi16(low, 4) : low, _mm256_set1_epi8(0x0f));
        if (type != WEIGHTS_Q4_K) {
            const __m256i high = bits_to(_mm256_loadu_si256((const __m256i *)(super + at.high)), at.hbit, 4);
            v = _mm256_or_si256(v, _mm256_and_si256(high, _mm256_set1_epi8(type == WEIGHTS_Q5_K ? 0x10 : 0x30)));
        }
        _mm256_storeu_si256((__m256i *)(out + 32 * s), v);
    }
    k_scales_of(row, type, sb, ks);
}

/* Block s of super-block sb (decoded in `bytes`) into acc and mins, as q8_k.h's q8_group_k_block. */
static inline __attribute__((always_inline)) void q8_lanes_k_block(const uint8_t bytes[Q8_LANES_GROUP][256],
                                                                  const KScales ks[Q8_LANES_GROUP], int s,
                                                                  const __m512i *xb, __m512 acc[Q8_LANES_GROUP],
                                                                  __m512 mins[Q8_LANES_GROUP], const int32_t type) {
    const uint8_t *wb[Q8_LANES_GROUP];
    __m512i dots[Q8_LANES_GROUP];
    float scale[Q8_LANES_GROUP];
    const __m512 dx = _mm512_castsi512_ps(xb[LANE_DX]);
    for (int j = 0; j < Q8_LANES_GROUP; j++) wb[j] = bytes[j] + 32 * s;
    if (type == WEIGHTS_Q6_K) { /* two halves, a scale each */
        for (int h = 0; h < 2; h++) {
            for (int j = 0; j < Q8_LANES_GROUP; j++) dots[j] = xb[LANE_START_HALF + h], scale[j] = ks[j].d[2 * s + h];
            q8_lanes_dots(wb, xb, 4 * h, 4, dots);
            q8_lanes_scale(dots, scale, dx, acc);
        }
        return;
    }
    for (int j = 0; j < Q8_LANES_GROUP; j++) dots[j] = _mm512_setzero_si512(), scale[j] = ks[j].d[s];
    q8_lanes_dots(wb, xb, 0, 8, dots);
    q8_lanes_scale(dots, scale, dx, acc);
    const __m512 sx = _mm512_castsi512_ps(xb[LANE_SX]);
    for (int j = 0; j < Q8_LANES_GROUP; j++) mins[j] = _mm512_fmadd_ps(_mm512_set1_ps(-ks[j].m[s]), sx, mins[j]);
}

/* y[i, first + j] (+)= acc[j] + mins[j]'s lane i for the count rows of x and the group's valid weight rows. */
static inline void q8_lanes_store(const __m512 acc[Q8_LANES_GROUP], const __m512 mins[Q8_LANES_GROUP], int count,
                                  float *y, int64_t n, int64_t first, int add) {
    float sums[Q8_LANES_GROUP][Q8_LANE_ROWS] __attribute__((aligned(64)));
    for (int j = 0; j < Q8_LANES_GROUP; j++) _mm512_store_ps(sums[j], _mm512_add_ps(acc[j], mins[j]));
    const int64_t valid = n - first < Q8_LANES_GROUP ? n - first : Q8_LANES_GROUP;
    for (int i = 0; i < count; i++)
        for (int64_t j = 0; j < valid; j++) {
            float *out = y + i * n + first + j;
            *out = add ? sums[j][i] + *out : sums[j][i];
        }
}

/* A group of Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 weight rows from `first` against 16 rows of x in lanes (xl), every
 * block (decoded again for each 16 rows: a few operations beside its eight products), into acc and mins. */
static inline __attribute__((always_inline)) void q8_lanes_block_group(const Weights *w, const __m512i *xl,
                                                                      int64_t blocks, int64_t n, int64_t first,
                                                                      int prefetch, __m512 acc[Q8_LANES_GROUP],
                                                                      __m512 mins[Q8_LANES_GROUP],
                                                                      const int32_t type) {
    const uint8_t *row[Q8_LANES_GROUP];
    q8_lane_rows(w, n, first, row);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_LANES_GROUP, prefetch ? Q8_LANES_GROUP : 0, blocks);
    for (int j = 0; j < Q8_LANES_GROUP; j++) acc[j] = mins[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        ahead_step(&ahead);
        q8_lanes_block(row, b, xl + b * Q8_LANE_VECTORS, acc, mins, type);
    }
}

/* A K-quant group of weight rows from `first` against every 16 rows of x (`chunks` of them): each super-block
 * of the 8 rows decoded once (for a prompt's chunk of 512 rows, decoding it again for each 16 would cost more
 * than its products), then taken by each 16 rows in turn, whose sums wait in `sums` (acc, then mins: 16 vectors
 * for each 16 rows) between super-blocks. */
static inline __attribute__((always_inline)) void q8_lanes_k_group(const Weights *w, const __m512i *xl,
                                                                  int64_t chunks, int64_t blocks, int64_t n,
                                                                  int64_t first, __m512 *sums, const int32_t type) {
    const uint8_t *row[Q8_LANES_GROUP];
    q8_lane_rows(w, n, first, row);
    Ahead ahead = stored_rows_ahead(w, n, first + 2 * Q8_LANES_GROUP, Q8_LANES_GROUP, blocks);
    for (int64_t i = 0; i < chunks * 2 * Q8_LANES_GROUP; i++) sums[i] = _mm512_setzero_ps();
    uint8_t bytes[Q8_LANES_GROUP][256] __attribute__((aligned(32)));
    KScales ks[Q8_LANES_GROUP];
    for (int64_t sb = 0; sb < blocks / 8; sb++) {
        for (int j = 0; j < Q8_LANES_GROUP; j++) q8_lanes_k_decode(row[j], sb, bytes[j], &ks[j], type);
        for (int s = 0; s < 8; s++) ahead_step(&ahead);
        for (int64_t ch = 0; ch < chunks; ch++) {
            __m512 *acc = sums + ch * 2 * Q8_LANES_GROUP, *mins = acc + Q8_LANES_GROUP;
            __m512 a[Q8_LANES_GROUP], m[Q8_LANES_GROUP];
            for (int j = 0; j < Q8_LANES_GROUP; j++) a[j] = acc[j], m[j] = mins[j];
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++)
                q8_lanes_k_block(bytes, ks, s, xl + (ch * blocks + 8 * sb + s) * Q8_LANE_VECTORS, a, m, type);
            for (int j = 0; j < Q8_LANES_GROUP; j++) acc[j] = a[j], mins[j] = m[j];
        }
    }
}

/* One group of weight rows for every 16 rows of x, the type a constant. */
static inline __attribute__((always_inline)) void q8_lanes_t(const __m512i *xl, __m512 *sums, const Weights *w,
                                                            float *y, int64_t m, int64_t blocks, int64_t n,
                                                            int64_t first, int add, const int32_t type) {
    const int64_t chunks = (m + Q8_LANE_ROWS - 1) / Q8_LANE_ROWS;
    if (is_k_quant(type)) q8_lanes_k_group(w, xl, chunks, blocks, n, first, sums, type);
    for (int64_t ch = 0; ch < chunks; ch++) {
        __m512 *acc = sums + ch * 2 * Q8_LANES_GROUP, *mins = acc + Q8_LANES_GROUP;
        if (!is_k_quant(type))
            q8_lanes_block_group(w, xl + ch * blocks * Q8_LANE_VECTORS, blocks, n, first, ch == 0, acc, mins, type);
        q8_lanes_store(acc, mins, q8_lane_count(m, ch), y + ch * Q8_LANE_ROWS * n, n, first, add);
    }
}

/* y (m, n) (+)= x (m, k) @ w.T for q8_lanes_read(w->type) and m >= Q8_LANES_MIN_ROWS, inside the OpenMP region:
 * `lanes` this thread's q8_lanes_bytes (its own copy of x in lanes: cheaper than a barrier). Weight rows in groups
 * of 8 shared among the threads; each group's bytes stay in L1 while every 16 rows of x take them. */
static void project_q8_lanes(const Q8Rows *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                             int add, void *lanes) {
    const int64_t blocks = k / QBLOCK, chunks = (m + Q8_LANE_ROWS - 1) / Q8_LANE_ROWS;
    __m512i *xl = (__m512i *)(((uintptr_t)lanes + 63) & ~(uintptr_t)63);
    __m512 *sums = (__m512 *)(xl + chunks * blocks * Q8_LANE_VECTORS);
    for (int64_t ch = 0; ch < chunks; ch++) {
        q8_to_lanes(x, ch * Q8_LANE_ROWS, q8_lane_count(m, ch), blocks, xl + ch * blocks * Q8_LANE_VECTORS);
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (n + Q8_LANES_GROUP - 1) / Q8_LANES_GROUP; t++) {
        switch (w->type) {
        case WEIGHTS_Q4_K: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q4_K); break;
        case WEIGHTS_Q5_K: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q5_K); break;
        case WEIGHTS_Q6_K: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q6_K); break;
        case WEIGHTS_Q4_0: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q4_0); break;
        case WEIGHTS_Q4_1: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q4_1); break;
        case WEIGHTS_Q5_0: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q5_0); break;
        case WEIGHTS_Q5_1: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q5_1); break;
        default: q8_lanes_t(xl, sums, w, y, m, blocks, n, t * Q8_LANES_GROUP, add, WEIGHTS_Q8_0); break;
        }
    }
}
#else
#define Q8_LANES 0
static inline int q8_lanes_read(int32_t type) { return (void)type, 0; }
static inline int64_t q8_lanes_bytes(int64_t m, int64_t k) { return (void)m, (void)k, 0; }
#endif

#endif
