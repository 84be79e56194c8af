/* The fast precision's Q8_0 projections on AVX-512 VNNI, from a matrix regrouped at load (grouped_q8.py): every
 * 16 rows one group, and a group's block b (544 bytes, 16 of Q8_0's 34-byte blocks) its 16 float16 d, then its
 * 32 weights as 8 vectors of 64 bytes, vector c holding weights 4c .. 4c + 3 of row j at bytes 4j .. 4j + 3, each
 * + 128 (unsigned, for vpdpbusd; the chain starts at -128 sum(qx)).
 *
 * Why: Gemma 3's output head (262,144 x 640 Q8_0, 178 MB) is most of a batch-1 step's bytes, and as stored its
 * rows take 8 x 4-byte transposes, shuffles and a gather per block before vpdpbusd (q8_dots.h's groups): 7.0 ms
 * a step where reading the bytes takes 5.2. Regrouped, a block of 16 rows is 8 loads, 8 vpdpbusd per row of x
 * with the x words broadcast from memory, one conversion and one FMA, and the matrix one stream read in order.
 *
 * Each (x row, weight row) pair does q8_dots.h's float operations in its order: per block the exact integer dot
 * product converted, times dw * dx, by one FMA into the row's sum, block after block; then + 0 (the groups' empty
 * offset term) and, with `add`, + y. So a row's result is the bit pattern the stored matrix gives on q8_dots.h's
 * and q8_lanes.h's paths, whatever its step's size.
 */
#ifndef PAGEDSERVE_Q8_GROUPED_H
#define PAGEDSERVE_Q8_GROUPED_H

#if Q8_GROUPED_BUILT
#define GROUPED_ROWS 16                   /* weight rows a group: one a lane */
#define GROUPED_BLOCK (GROUPED_ROWS * 34) /* bytes of a group's block */
#define GROUPED_CHUNK 8                   /* rows of x at once: 8 sums beside the block's 8 weight vectors */
/* Prefetched into L2 this far ahead of the block being read (8 blocks: 34 GB/s of the host's 37 from one
 * stream per thread, against 26 without; into L1 instead, 29) */
#define GROUPED_AHEAD (8 * GROUPED_BLOCK)

/* Block b of rows `rows` of x (their rounded blocks from `at`, one x row apart by `blocks`) against the group's
 * block: sums[i] += dot * (dw * dx), a lane a weight row. */
static inline __attribute__((always_inline)) void grouped_block(const Q8Rows *x, const uint8_t *block, int64_t at,
                                                               int64_t blocks, __m512 sums[GROUPED_CHUNK],
                                                               const int rows) {
    for (int l = 0; l < GROUPED_BLOCK; l += 64) _mm_prefetch((const char *)block + GROUPED_AHEAD + l, _MM_HINT_T2);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)block));
    __m512i w[8];
    for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(block + 32 + 64 * c);
    for (int i = 0; i < rows; i++) {
        const int64_t row_at = at + i * blocks;
        const int32_t *qx = (const int32_t *)(x->q + row_at * QBLOCK);
        __m512i even = _mm512_set1_epi32(-128 * x->n[row_at]), odd = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            even = _mm512_dpbusd_epi32(even, w[c], _mm512_set1_epi32(qx[c]));
            odd = _mm512_dpbusd_epi32(odd, w[c + 4], _mm512_set1_epi32(qx[c + 4]));
        }
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x->d[row_at]));
        sums[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), scale, sums[i]);
    }
}

/* y[i, first + j] (+)= x_i . w_{first + j} for `rows` rows of x (a constant once inlined) and one group. */
static inline __attribute__((always_inline)) void grouped_t(const Q8Rows *x, const uint8_t *group, float *y,
                                                           int64_t blocks, int64_t n, int64_t first, int add,
                                                           const int rows) {
    __m512 sums[GROUPED_CHUNK];
    for (int i = 0; i < rows; i++) sums[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) grouped_block(x, group + b * GROUPED_BLOCK, b, blocks, sums, rows);
    for (int i = 0; i < rows; i++) {
        float *out = y + i * n + first;
        __m512 v = _mm512_add_ps(sums[i], _mm512_setzero_ps());
        if (add) v = _mm512_add_ps(v, _mm512_loadu_ps(out));
        _mm512_storeu_ps(out, v);
    }
}

/* One group against `count` (1..GROUPED_CHUNK) rows of x. */
static void grouped_of(const Q8Rows *x, const uint8_t *group, float *y, int count, int64_t blocks, int64_t n,
                       int64_t first, int add) {
    switch (count) {
#define GROUPED_CASE(R) case R: grouped_t(x, group, y, blocks, n, first, add, R); break;
        GROUPED_CASE(8) GROUPED_CASE(7) GROUPED_CASE(6) GROUPED_CASE(5) GROUPED_CASE(4) GROUPED_CASE(3)
        GROUPED_CASE(2)
#undef GROUPED_CASE
    default: grouped_t(x, group, y, blocks, n, first, add, 1); break;
    }
}

/* y (m, n) (+)= x (m, k) @ w.T for a regrouped Q8_0 matrix (n % 16 == 0), any m, shared among the threads of the
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
                       add);
        }
}
#endif

#endif
