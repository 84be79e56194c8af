/* The fast precision's Q8_0 and Q5_0 projections on AVX-512 VNNI, from a matrix regrouped at load
 * (grouped_q8.py): every 16 rows one group, and a group's block b (16 of the type's blocks) their 16 float16 d,
 * Q5_0's 16 words of fifth bits (qh), then the weights as vectors of one 4-byte word per row: vector c holds word
 * c of row j at bytes 4j .. 4j + 3. Q8_0: 8 words of 4 weights, each + 128 (unsigned, for vpdpbusd; the chain
 * starts at -128 sum(qx)). Q5_0: 4 words of the stored nibble bytes (byte i: weight i low, i + 16 high), each
 * weight's fifth bit from qh added here.
 *
 * Why: Gemma 3's output head (262,144 x 640 Q8_0, 178 MB) is most of a batch-1 step's bytes, and as stored its
 * rows take 8 x 4-byte transposes, shuffles and a gather per block before vpdpbusd (q8_dots.h's groups): 7.0 ms
 * a step where reading the bytes takes 5.2. Regrouped, a block of 16 rows is 8 loads, 8 vpdpbusd per row of x
 * with the x words broadcast from memory, one conversion and one FMA, and the matrix one stream read in order.
 * Q5_0 (Gemma's gate / up and half its QKV matrices, half of its layers' bytes) the same, with its nibbles split
 * and fifth bits masked in.
 *
 * Each (x row, weight row) pair does q8_dots.h's float operations in its order: per block the exact integer dot
 * product converted, times dw * dx, by one FMA into the row's sum, and Q5_0's offset (-16 dw) times sx by one
 * FMA into a second; block after block; then their sum (Q8_0's second is 0) and, with `add`, + y. So a row's
 * result is the bit pattern the stored matrix gives on q8_dots.h's and q8_lanes.h's paths, whatever its step's
 * size.
 */
#ifndef PAGEDSERVE_Q8_GROUPED_H
#define PAGEDSERVE_Q8_GROUPED_H

#if Q8_GROUPED_BUILT
#define GROUPED_ROWS 16  /* weight rows a group: one a lane */
#define GROUPED_CHUNK 8  /* rows of x at once: 8 sums (and Q5_0's 8 offset sums) beside the block's 8 vectors */
#define GROUPED_AHEAD 8  /* blocks prefetched into L2 ahead of the one read (Q8_0: 34 GB/s of the host's 37 from
                            one stream per thread, against 26 without; into L1 instead, 29) */

/* Bytes of a group's block: 16 of the stored type's. */
static inline int64_t grouped_block_bytes(int32_t type) {
    return GROUPED_ROWS * q8_block_bytes(type == WEIGHTS_Q8_0_G16 ? WEIGHTS_Q8_0 : WEIGHTS_Q5_0);
}

/* Q5_0's 4 weights of word c of each row (its low nibbles, or with `high` its high ones: weights 16 + 4c ..) with
 * their fifth bits: byte t of row j's lane gets 16 where bit 4c + t (+ 16) of its qh is set. */
static inline __attribute__((always_inline)) __m512i q5_word(__m512i nibbles, __m512i qh, int c, int high) {
    const __m512i q = _mm512_and_si512(high ? _mm512_srli_epi16(nibbles, 4) : nibbles, _mm512_set1_epi8(0x0f));
    const char at = (char)(2 * high + c / 2); /* the byte of qh holding those 4 bits, in each 4-byte lane */
    const __m512i lanes = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c));
    const __m512i pick = _mm512_add_epi8(_mm512_set1_epi8(at), lanes); /* every byte of word p: byte 4p + at */
    const __m512i spread = _mm512_shuffle_epi8(qh, pick);
    const __m512i bit = _mm512_set1_epi32(c % 2 ? (int)0x80402010 : 0x08040201);
    return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(spread, bit), q, _mm512_set1_epi8(0x10));
}

/* The block's 8 weight vectors, unsigned (w[c]: weights 4c .. 4c + 3, w[c + 4]: 16 + 4c ..), and d. */
static inline __attribute__((always_inline)) __m512 grouped_weights(const uint8_t *block, __m512i w[8],
                                                                   const int32_t type) {
    if (type == WEIGHTS_Q8_0_G16)
        for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(block + 32 + 64 * c);
    else {
        const __m512i qh = _mm512_loadu_si512(block + 32);
        for (int c = 0; c < 4; c++) {
            const __m512i nibbles = _mm512_loadu_si512(block + 96 + 64 * c);
            w[c] = q5_word(nibbles, qh, c, 0), w[c + 4] = q5_word(nibbles, qh, c, 1);
        }
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)block));
}

/* Block b of rows `rows` of x (their rounded blocks from `at`, one x row apart by `blocks`) against the group's
 * block: sums[i] += dot * (dw * dx), and for Q5_0 mins[i] += -16 dw * sx, a lane a weight row. */
static inline __attribute__((always_inline)) void grouped_block(const Q8Rows *x, const uint8_t *block, int64_t at,
                                                               int64_t blocks, __m512 sums[GROUPED_CHUNK],
                                                               __m512 mins[GROUPED_CHUNK], const int rows,
                                                               const int32_t type) {
    const int64_t bytes = grouped_block_bytes(type);
    for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)block + GROUPED_AHEAD * bytes + l, _MM_HINT_T2);
    __m512i w[8];
    const __m512 d = grouped_weights(block, w, type);
    const int q8 = type == WEIGHTS_Q8_0_G16;
    const __m512 offset = _mm512_mul_ps(d, _mm512_set1_ps(q8_offset(WEIGHTS_Q5_0))); /* Q5_0's mw */
    for (int i = 0; i < rows; i++) {
        const int64_t row_at = at + i * blocks;
        const int32_t *qx = (const int32_t *)(x->q + row_at * QBLOCK);
        __m512i even = _mm512_set1_epi32(q8 ? -128 * x->n[row_at] : 0), odd = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            even = _mm512_dpbusd_epi32(even, w[c], _mm512_set1_epi32(qx[c]));
            odd = _mm512_dpbusd_epi32(odd, w[c + 4], _mm512_set1_epi32(qx[c + 4]));
        }
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x->d[row_at]));
        sums[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), scale, sums[i]);
        if (!q8) mins[i] = _mm512_fmadd_ps(offset, _mm512_set1_ps(x->s[row_at]), mins[i]);
    }
}

/* y[i, first + j] (+)= x_i . w_{first + j} for `rows` rows of x (a constant once inlined) and one group. */
static inline __attribute__((always_inline)) void grouped_t(const Q8Rows *x, const uint8_t *group, float *y,
                                                           int64_t blocks, int64_t n, int64_t first, int add,
                                                           const int rows, const int32_t type) {
    __m512 sums[GROUPED_CHUNK], mins[GROUPED_CHUNK];
    for (int i = 0; i < rows; i++) sums[i] = mins[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++)
        grouped_block(x, group + b * grouped_block_bytes(type), b, blocks, sums, mins, rows, type);
    for (int i = 0; i < rows; i++) {
        float *out = y + i * n + first;
        __m512 v = _mm512_add_ps(sums[i], mins[i]);
        if (add) v = _mm512_add_ps(v, _mm512_loadu_ps(out));
        _mm512_storeu_ps(out, v);
    }
}

/* One group against `count` (1..GROUPED_CHUNK) rows of x. */
static void grouped_of(const Q8Rows *x, const uint8_t *group, float *y, int count, int64_t blocks, int64_t n,
                       int64_t first, int add, int32_t type) {
#define GROUPED_ROWS_OF(T)                                                                                          \
    switch (count) {                                                                                                \
    case 8: grouped_t(x, group, y, blocks, n, first, add, 8, T); break;                                             \
    case 7: grouped_t(x, group, y, blocks, n, first, add, 7, T); break;                                             \
    case 6: grouped_t(x, group, y, blocks, n, first, add, 6, T); break;                                             \
    case 5: grouped_t(x, group, y, blocks, n, first, add, 5, T); break;                                             \
    case 4: grouped_t(x, group, y, blocks, n, first, add, 4, T); break;                                             \
    case 3: grouped_t(x, group, y, blocks, n, first, add, 3, T); break;                                             \
    case 2: grouped_t(x, group, y, blocks, n, first, add, 2, T); break;                                             \
    default: grouped_t(x, group, y, blocks, n, first, add, 1, T); break;                                            \
    }
    if (type == WEIGHTS_Q8_0_G16) {
        GROUPED_ROWS_OF(WEIGHTS_Q8_0_G16)
    } else {
        GROUPED_ROWS_OF(WEIGHTS_Q5_0_G16)
    }
#undef GROUPED_ROWS_OF
}

/* y (m, n) (+)= x (m, k) @ w.T for a regrouped matrix (n % 16 == 0), any m, shared among the threads of the
 * enclosing OpenMP region by groups; `mine`: this thread's q8_x_bytes(m, k), where it rounds x itself. */
static void project_q8_grouped(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                               int add, void *mine) {
    const Q8Rows rows = q8_rows_in(mine, m, k);
    q8_quantize(x, m, k, &rows);
    const int64_t blocks = k / QBLOCK;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < n / GROUPED_ROWS; g++)
        for (int64_t r = 0; r < m; r += GROUPED_CHUNK) {
            const Q8Rows chunk = q8_rows_from(&rows, r, k);
            const int count = (int)(m - r < GROUPED_CHUNK ? m - r : GROUPED_CHUNK);
            grouped_of(&chunk, weights_row(w, g * GROUPED_ROWS), y + r * n, count, blocks, n, g * GROUPED_ROWS,
                       add, w->type);
        }
}
#endif

#endif
