/* The "fast" precision's projections. Steps of fewer than FAST_MIN_ROWS rows on Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
 * and the K-quants: x rounded to 8-bit integers per block and multiplied in integers (q8_dots.h, q8_k.h). For steps of
 * FAST_MIN_ROWS rows or more, y = x @ w.T with x and every weight rounded to bfloat16 (round to nearest even),
 * their products exact in float32 and summed in float32, on the CPU's AMX tile unit: TDPBF16PS multiplies a
 * 16 x 32 tile of weights by a 32 x 16 tile of x in one instruction, 8192 multiply-adds, where the float32
 * kernels do 8 per FMA. Each group of 16 weight rows is dequantized (quant.h) and converted once per call, then
 * used for every row of x: a batch pays the dequantization once per weight, as the exact kernels' strips do, and
 * little more.
 *
 * On AVX-512 builds, steps of FAST_MIN_ROWS to Q8_MAX_ROWS rows on the 8-bit path's types that the tiles do not
 * take (all of them without AMX; with it Q5_0, Q5_1 and the K-quants, and Q4_0, Q4_1 and Q8_0 below FAST_TILE
 * rows, where the tiles were slower) run the 8-bit path too, six rows of x at a time (q8_dots.h): 1.3-1.5x the exact
 * kernels' speed at 16-64 rows there (docs/PERFORMANCE.md); with AVX2's 16 registers, three rows at a time lost
 * to the exact strips. Steps of more rows where the CPU has no AMX or the
 * kernel does not let the process use it (Linux arch_prctl), other steps on other weight types, the rest on
 * Q5_0, Q5_1 and the K-quants (quant_k.h: no tiles read them), and every small step without AVX2 (or, on
 * AArch64, the dot product extension) run the exact kernels (quant_matmul.h): converting the weights to bfloat16
 * costs a step of one to three rows more than the tiles save. So in this precision a row's result can depend on
 * the size of its batch.
 * The reference of the tiles is the float32 product of the rounded values (tests/backends/test_native_fast.py),
 * and the accuracy benchmark (bench/precision.py) measures what the rounding costs against the exact precision.
 */
#ifndef PAGEDSERVE_FAST_MATMUL_H
#define PAGEDSERVE_FAST_MATMUL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "q8_dots.h"
#include "quant_matmul.h"
#include "threads.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define FAST_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define FAST_AMX 0
#endif

#define FAST_TILE 16   /* rows of x, and weight rows, per tile */
#define FAST_K 32      /* weights (bfloat16 pairs x 16) per tile row of 64 bytes */
#define FAST_MIN_ROWS 4 /* fewer rows of x: q8_dots.h or exact (cheaper than converting the weights) */
#define Q8_MAX_ROWS 64  /* more rows of x: the tiles or exact (a prompt chunk: the strips decode a weight once) */

/* float32 -> bfloat16, round to nearest even (x never NaN here: activations and weights are finite). */
static inline uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}



#if FAST_AMX
#include <immintrin.h>

enum { AMX_UNKNOWN, AMX_ON, AMX_OFF };
static int amx_state = AMX_UNKNOWN; /* the process's permission: asked once (fast_matmul_init) */

/* Asks Linux for the tile data state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); 1 when AMX may be used. */
static int amx_request(void) {
    if (amx_state == AMX_UNKNOWN) amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? AMX_ON : AMX_OFF;
    return amx_state == AMX_ON;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

/* Tiles 0-3: C (16 x 16 float32) for two tiles of weight rows by two tiles of x rows; 4-5: A (16 weight rows x
 * 32 bfloat16, as the rows are stored); 6-7: B (x's rows as TDPBF16PS reads its second operand: the pair of
 * values 2p, 2p + 1 of each of 16 rows side by side in its row p). The weights are the first operand so that
 * they need no rearranging: each is converted where it is dequantized, and only x (a few rows, once per call)
 * is rearranged. Four accumulators, because a tile product waits for the previous one into the same C: with
 * two, the unit was idle most of the time (a 64-row step's products took 1.4 ms for 17.7 M weights). */
static void amx_configure(void) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) config.rows[t] = 16, config.bytes_per_row[t] = 64;
    _tile_loadconfig(&config);
}

/* 32 floats from `from` as 16 bfloat16 pairs, zeros past `left` of them (k % 8 == 0: a partial slice ends in
 * whole vectors; left <= 0: all zeros). */
static inline __m512i bf16_slice(const float *from, int64_t left) {
    const __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : left > 0 ? (1u << left) - 1 : 0);
    const __mmask16 hi = (__mmask16)(left >= 32 ? 0xffff : left > 16 ? (1u << (left - 16)) - 1 : 0);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, from + 16), _mm512_maskz_loadu_ps(lo, from));
}

/* x as B tiles: tile (mt, kt), 16 rows of 32 bfloat16 at xv + (mt * tiles_k + kt) * 512, row p holding
 * x[mt * 16 + j][kt * 32 + 2p + e] at 2j + e: each row's 32 values converted at once, their 16 pairs scattered
 * down column j. Rows past m and columns past k are zeros. */
static void x_to_tiles(const float *x, int64_t m, int64_t k, int64_t kp, uint16_t *xv, int64_t m_padded) {
    const int64_t tiles_k = kp / FAST_K;
    const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(FAST_TILE)); /* a column's 16 pairs, in u32 */
#pragma omp for schedule(static)
    for (int64_t mt = 0; mt < m_padded / FAST_TILE; mt++) {
        memset(xv + mt * tiles_k * FAST_K * FAST_TILE, 0, sizeof(uint16_t) * (size_t)(tiles_k * FAST_K * FAST_TILE));
        for (int64_t j = 0; j < FAST_TILE && mt * FAST_TILE + j < m; j++)
            for (int64_t kt = 0; kt < tiles_k; kt++) {
                const __m512i pairs = bf16_slice(x + (mt * FAST_TILE + j) * k + kt * FAST_K, k - kt * FAST_K);
                _mm512_i32scatter_epi32((int *)(xv + (mt * tiles_k + kt) * FAST_K * FAST_TILE) + j, down, pairs, 4);
            }
    }
}

/* One weight row as kp bfloat16 values (zeros past k): each block dequantized in registers (quant_wide.h) and
 * converted 32 values at a time, straight into the A rows; `type` a constant (DISPATCH_TYPE). Through a float
 * buffer (dequantized, stored, reloaded, converted) this took about three times as long. */
static inline __attribute__((always_inline)) void row_to_bf16_t(const uint8_t *row, int64_t k, int64_t kp,
                                                                uint16_t *to, const int32_t type) {
    const int64_t blocks = k / QBLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        __m512 v[2];
        deq_block16(row, type, b, v);
        _mm512_storeu_si512(to + b * QBLOCK, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
    }
    if (kp > blocks * QBLOCK) { /* the float types' last 8-24 values (k % 8 == 0), then zeros */
        float part[QBLOCK] = {0};
        for (int64_t c = blocks * 4; c < k / LANES; c++) {
            const vec8 v = deq8_float(row, type, c);
            memcpy(part + (c - blocks * 4) * LANES, &v, sizeof v);
        }
        _mm512_storeu_si512(to + blocks * QBLOCK, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(part + 16),
                                                                                _mm512_loadu_ps(part)));
    }
}

/* 16 weight rows (first.., zeros past n) as bfloat16 A rows of kp values. */
static void weights_to_tiles(const Weights *w, int64_t first, int64_t n, int64_t k, int64_t kp, uint16_t *a) {
    for (int64_t j = 0; j < FAST_TILE; j++) {
        uint16_t *to = a + j * kp;
        if (first + j >= n) {
            memset(to, 0, sizeof(uint16_t) * (size_t)kp);
            continue;
        }
        const uint8_t *row = weights_row(w, first + j);
#define ROW_TO_BF16(T) row_to_bf16_t(row, k, kp, to, T)
        DISPATCH_TYPE(w->type, ROW_TO_BF16)
#undef ROW_TO_BF16
    }
}

/* Work for the vector units while the tiles multiply (tile_products): a regrouped span's blocks converted to the
 * tiles' second operand, one block a slice. */
typedef struct {
    const uint8_t *groups[2]; /* the span's groups (q8_grouped.h); NULL: none */
    int64_t k;
    uint16_t *b_tiles; /* where: each group's k / 32 tiles of 16 rows of 64 bytes */
} GroupConversion;

#if Q8_GROUPED_BUILT
/* A group's block as one B tile (16 rows of 64 bytes): its vector c (k = 4c .. 4c + 3 of rows 0..15) becomes B
 * rows 2c and 2c + 1 (pairs (4c, 4c + 1) and (4c + 2, 4c + 3), row j's at 4j), each value q * d rounded to
 * bfloat16 as deq_block16 rounds a stored block's. */
static void group_block_to_b(const uint8_t *block, uint16_t *tile) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512i w[8]; /* the weights + 128 (q8_grouped.h) */
    const __m512 d = grouped_weights(block, w, WEIGHTS_Q8_0_G16);
    __m512 dq[4]; /* lane l of dq[h]: row 4h + l / 4's d */
    for (int h = 0; h < 4; h++) dq[h] = _mm512_permutexvar_ps(_mm512_add_epi32(quarter, _mm512_set1_epi32(4 * h)), d);
    for (int c = 0; c < 8; c++) {
        const __m512i q = _mm512_xor_si512(w[c], _mm512_set1_epi8((char)0x80));
        __m512 v[4];
        for (int h = 0; h < 4; h++)
            v[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(q, h))), dq[h]);
        const __m512i rows0 = (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]), rows1 = (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]);
        _mm512_storeu_si512(tile + (2 * c) * FAST_K, _mm512_permutex2var_epi32(rows0, even, rows1));
        _mm512_storeu_si512(tile + (2 * c + 1) * FAST_K, _mm512_permutex2var_epi32(rows0, odd, rows1));
    }
}
#endif

/* Block b of each group of `work` converted (none: NULL). */
static inline void convert_block(const GroupConversion *work, int64_t b) {
#if Q8_GROUPED_BUILT
    if (work == NULL) return;
    for (int g = 0; g < 2; g++)
        if (work->groups[g] != NULL)
            group_block_to_b(work->groups[g] + b * grouped_block_bytes(WEIGHTS_Q8_0_G16), work->b_tiles + (g * work->k / QBLOCK + b) * FAST_TILE * FAST_K);
#else
    (void)work, (void)b;
#endif
}

/* Four 16 x 16 C blocks into c: first0 . second0, first1 . second0, first0 . second1, first1 . second1 (first1
 * or second1 NULL: not computed), summed over kts slices of 32 values; a first operand's slice kt at + kt * 32,
 * its rows first_stride bytes apart, a second operand's at + kt * second_step, its rows 64 bytes apart. `also`
 * (NULL: none): block kt of the next span's groups converted after slice kt's products are issued, so that the
 * vector units convert while the tile unit multiplies. */
static void tile_products(const uint16_t *first0, const uint16_t *first1, int64_t first_stride,
                          const uint16_t *second0, const uint16_t *second1, int64_t second_step, int64_t kts,
                          float *c, const GroupConversion *also) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kt = 0; kt < kts; kt++) {
        _tile_loadd(4, first0 + kt * FAST_K, first_stride);
        _tile_loadd(6, second0 + kt * second_step, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (first1 != NULL) {
            _tile_loadd(5, first1 + kt * FAST_K, first_stride);
            _tile_dpbf16ps(1, 5, 6);
        }
        if (second1 != NULL) {
            _tile_loadd(7, second1 + kt * second_step, 64);
            _tile_dpbf16ps(2, 4, 7);
            if (first1 != NULL) _tile_dpbf16ps(3, 5, 7);
        }
        convert_block(also, kt); /* kts is the groups' block count: k % 32 == 0 */
    }
    const int64_t block = FAST_TILE * FAST_TILE;
    _tile_stored(0, c, 64);
    if (first1 != NULL) _tile_stored(1, c + block, 64);
    if (second1 != NULL) _tile_stored(2, c + 2 * block, 64);
    if (second1 != NULL && first1 != NULL) _tile_stored(3, c + 3 * block, 64);
}

/* C (weight rows x rows of x) for weight tiles a0, a1 (a1 NULL: none) against x tiles mt, mt + 1 (`pair`),
 * summed over K, into c: four 16 x 16 blocks, (a0, mt), (a1, mt), (a0, mt + 1), (a1, mt + 1). */
static void amx_tiles(const uint16_t *a0, const uint16_t *a1, int64_t kp, const uint16_t *xv, int64_t mt, int pair,
                      float *c) {
    const int64_t tiles_k = kp / FAST_K, tile = FAST_K * FAST_TILE;
    tile_products(a0, a1, kp * 2, xv + mt * tiles_k * tile, pair ? xv + (mt + 1) * tiles_k * tile : NULL, tile,
                  tiles_k, c, NULL);
}

/* y[i, first + j] (+)= one C block's c[j][i] for x tile mt: the valid rows of x and weight rows only, each
 * row's 16 values gathered down a column of the block (one by one, the stores took a third of a 64-row step). */
static void store_block(const float *c, float *y, int64_t m, int64_t n, int64_t mt, int64_t first, int add) {
    const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(FAST_TILE));
    const int64_t cols = n - first < FAST_TILE ? n - first : FAST_TILE;
    const __mmask16 valid = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
    for (int64_t i = mt * FAST_TILE; i < m && i < (mt + 1) * FAST_TILE; i++) {
        __m512 v = _mm512_i32gather_ps(down, c + (i - mt * FAST_TILE), 4);
        float *out = y + i * n + first;
        if (add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(valid, out));
        _mm512_mask_storeu_ps(out, valid, v);
    }
}

/* The tile path's share of one projection for this thread; inside the OpenMP region, as project_weights: two
 * tiles of weight rows (32) per iteration. xv: x as B tiles (m_padded / 16 x kp / 32 tiles), written here; a
 * (two tiles' A rows, 32 kp bfloat16), c (4 C blocks): this thread's buffers. */
static void project_amx(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                        uint16_t *xv, int64_t m_padded, int64_t kp, uint16_t *a, float *c) {
    x_to_tiles(x, m, k, kp, xv, m_padded); /* its omp for ends in a barrier: xv is complete */
    amx_configure();
    const int64_t span = 2 * FAST_TILE, block = FAST_TILE * FAST_TILE;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (n + span - 1) / span; t++) {
        const int64_t first = t * span, two = first + FAST_TILE < n;
        weights_to_tiles(w, first, n, k, kp, a);
        if (two) weights_to_tiles(w, first + FAST_TILE, n, k, kp, a + FAST_TILE * kp);
        /* the next weight rows' bytes into L2 while these products run */
        const int64_t next = first + span, rows = n - next < span ? n - next : span;
        for (int64_t line = 0; rows > 0 && line < rows * w->row_bytes; line += 64)
            __builtin_prefetch(weights_row(w, next) + line, 0, PREFETCH_LOCALITY);
        for (int64_t mt = 0; mt < m_padded / FAST_TILE; mt += 2) {
            const int pair = mt + 1 < m_padded / FAST_TILE;
            amx_tiles(a, two ? a + FAST_TILE * kp : NULL, kp, xv, mt, pair, c);
            store_block(c, y, m, n, mt, first, add);
            if (two) store_block(c + block, y, m, n, mt, first + FAST_TILE, add);
            if (pair) store_block(c + 2 * block, y, m, n, mt + 1, first, add);
            if (pair && two) store_block(c + 3 * block, y, m, n, mt + 1, first + FAST_TILE, add);
        }
    }
    _tile_release();
}

#if Q8_GROUPED_BUILT
/* Regrouped Q8_0 (q8_grouped.h) on the tiles, past 32 rows of x. A group's block is 16 rows x 4 bytes a vector,
 * which is how TDPBF16PS reads its second operand (pairs of values of 16 columns side by side), so here the
 * weights are the second operand and x the first: each vector converts to two B rows where the stored rows took
 * a transpose, and C comes out as rows of x, stored without gathers. Each C value is the same sum of the same
 * bfloat16 products in the same order as project_amx's (its operands swapped), so the results are the stored
 * matrix's, bit for bit. */

/* x as bfloat16 A rows: m_padded rows of k values (k % 32 == 0), zeros past m, shared among the threads. */
static void x_to_rows(const float *x, int64_t m, int64_t k, uint16_t *xa, int64_t m_padded) {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m_padded; i++)
        for (int64_t at = 0; at < k; at += FAST_K)
            _mm512_storeu_si512(xa + i * k + at, bf16_slice(x + i * k + at, i < m ? k - at : 0));
}

/* y[i, first + j] (+)= c[i][j] for the valid rows of x tile mt (rows of C are rows of x). */
static void store_rows(const float *c, float *y, int64_t m, int64_t n, int64_t mt, int64_t first, int add) {
    for (int64_t i = mt * FAST_TILE; i < m && i < (mt + 1) * FAST_TILE; i++) {
        __m512 v = _mm512_loadu_ps(c + (i - mt * FAST_TILE) * FAST_TILE);
        if (add) v = _mm512_add_ps(v, _mm512_loadu_ps(y + i * n + first));
        _mm512_storeu_ps(y + i * n + first, v);
    }
}

/* Span t's groups (two, or one at n's end) as a conversion into b_tiles. */
static GroupConversion span_groups(const Weights *w, int64_t t, int64_t n, int64_t k, uint16_t *b_tiles) {
    const int64_t first = t * 2 * GROUPED_ROWS;
    GroupConversion g = {{weights_row(w, first), NULL}, k, b_tiles};
    if (first + GROUPED_ROWS < n) g.groups[1] = weights_row(w, first + GROUPED_ROWS);
    return g;
}

/* One span's products against every pair of x tiles, stored; the next span's conversion beside the first pair. */
static void grouped_span(const GroupConversion *now, const GroupConversion *next, const uint16_t *xa, float *y,
                         int64_t m, int64_t m_padded, int64_t n, int64_t first, int add, float *c) {
    const int64_t k = now->k, block = FAST_TILE * FAST_TILE, two = now->groups[1] != NULL;
    for (int64_t mt = 0; mt < m_padded / FAST_TILE; mt += 2) {
        const int pair = mt + 1 < m_padded / FAST_TILE;
        const uint16_t *x0 = xa + mt * FAST_TILE * k, *x1 = pair ? x0 + FAST_TILE * k : NULL;
        tile_products(x0, x1, k * 2, now->b_tiles, two ? now->b_tiles + GROUPED_ROWS * k : NULL, FAST_TILE * FAST_K,
                      k / FAST_K, c, mt == 0 ? next : NULL);
        store_rows(c, y, m, n, mt, first, add);
        if (pair) store_rows(c + block, y, m, n, mt + 1, first, add);
        if (two) store_rows(c + 2 * block, y, m, n, mt, first + GROUPED_ROWS, add);
        if (pair && two) store_rows(c + 3 * block, y, m, n, mt + 1, first + GROUPED_ROWS, add);
    }
}

/* project_amx for a regrouped matrix (n % 16 == 0; k % 32 == 0, so kp == k): xa as project_amx's xv, b_tiles
 * two spans' B tiles (two groups each, 64 k values), c four C blocks. Each thread takes a run of spans of 32
 * rows (as a static schedule would) and converts span t + 1 while the tiles multiply span t; a barrier ends it. */
static void project_amx_grouped(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                                int add, uint16_t *xa, int64_t m_padded, uint16_t *b_tiles, float *c, int thread) {
    x_to_rows(x, m, k, xa, m_padded); /* its omp for ends in a barrier: xa is complete */
    amx_configure();
    const int64_t spans = (n + 2 * GROUPED_ROWS - 1) / (2 * GROUPED_ROWS), share = (spans + TEAM_SIZE - 1) / TEAM_SIZE;
    const int64_t begin = thread * share, end = begin + share < spans ? begin + share : spans;
    if (begin < end) {
        const GroupConversion first = span_groups(w, begin, n, k, b_tiles);
        for (int64_t b = 0; b < k / QBLOCK; b++) convert_block(&first, b);
    }
    for (int64_t t = begin; t < end; t++) {
        uint16_t *now_tiles = b_tiles + ((t - begin) % 2) * 2 * GROUPED_ROWS * k;
        uint16_t *next_tiles = b_tiles + ((t - begin + 1) % 2) * 2 * GROUPED_ROWS * k;
        const GroupConversion now = span_groups(w, t, n, k, now_tiles);
        GroupConversion next = {{NULL, NULL}, k, next_tiles};
        if (t + 1 < end) next = span_groups(w, t + 1, n, k, next_tiles);
        for (int64_t line = 0; t + 2 < end && line < 2 * GROUPED_ROWS * w->row_bytes; line += 64) /* the one after */
            __builtin_prefetch(weights_row(w, (t + 2) * 2 * GROUPED_ROWS) + line, 0, PREFETCH_LOCALITY);
        grouped_span(&now, t + 1 < end ? &next : NULL, xa, y, m, m_padded, n, t * 2 * GROUPED_ROWS, add, c);
    }
    _tile_release();
#pragma omp barrier
}
#endif
#endif /* FAST_AMX */

/* Whether a step of m rows on weights the tiles read takes the 8-bit path instead: Q4_0 / Q4_1 below a tile
 * (SmolLM2's Q4_1 at batch 4: 16 ms against the tiles' 27; even at 16 rows), Q8_0 below a tile, and with x in
 * lanes (q8_lanes.h) up to 32 rows (Gemma 3's head, one thread: 18.5 ms against 30.8 at 16 rows, even at 32, 73
 * against 55 at 64). */
static inline int q8_before_tiles(int32_t type, int64_t m) {
    if (!q8_reads(type)) return 0;
    return m < FAST_TILE || (Q8_LANES && type == WEIGHTS_Q8_0 && m <= 2 * FAST_TILE);
}

/* Whether the 8-bit path takes a step of m rows on these weights, where the work was sized for it: up to
 * Q8_MAX_ROWS rows any type it reads; past them, with x in lanes (q8_lanes.h), Q8_0 and the K-quants (a prompt's
 * chunk on Gemma 3's layers: the exact strips' float32 FMAs did a quarter of vpdpbusd's multiply-adds each). */
static inline int q8_takes(int32_t type, int64_t m) {
    return q8_reads(type) && (m <= Q8_MAX_ROWS || (Q8_LANES && q8_lanes_read(type)));
}

/* 1 when the fast projections run on AMX in this process, 0 when on the plain path. */
static inline int fast_uses_amx(void) {
#if FAST_AMX
    return amx_request();
#else
    return 0;
#endif
}


/* What the projections of one call (a step, or one standalone projection) need besides their inputs: each
 * thread's buffer (project_weights' strips, or the tiles' converted weights), and, when this call's fast
 * projections run on tiles, x as tiles. Sized for m rows of x and input widths up to kmax. */
typedef struct {
    float *per_thread; /* `stride` floats per thread */
    float *x_lanes;    /* exact, from MIN_BLOCKED_ROWS rows: x in nibble order, shared (m x kmax floats) */
    uint16_t *xv;      /* tiles only: x as B tiles (m_padded / 16 x kp / 32 tiles of 512 values) */
    int64_t m_padded, kp, stride;
    int tiles; /* the fast precision on AMX tiles for this call */
    int q8;    /* the fast precision's small step: x rounded to 8 bits (q8_dots.h), where the weights' type allows */
} ProjectionWork;

/* 0 when out of memory (projection_work_free is still safe). */
static int projection_work_alloc(ProjectionWork *f, int64_t m, int64_t kmax, int threads, int fast) {
    memset(f, 0, sizeof *f);
    f->tiles = fast && m >= FAST_MIN_ROWS && fast_uses_amx();
    f->kp = (kmax + FAST_K - 1) / FAST_K * FAST_K;
    f->m_padded = (m + FAST_TILE - 1) / FAST_TILE * FAST_TILE;
    /* tiles: A for two tiles of weight rows (32 kp bfloat16 = 16 kp floats; a regrouped matrix's two spans of B
     * tiles, twice that) and 4 C blocks; exact: strips */
    const int64_t tiles = f->tiles ? 2 * FAST_TILE * f->kp + 4 * FAST_TILE * FAST_TILE : 0;
    /* past the small steps, only where a group takes x six rows at a time: three at a time lost to the strips */
    f->q8 = Q8_DOTS && fast && m > 0 && (m < FAST_MIN_ROWS || (Q8_CHUNK > 3 && m <= Q8_MAX_ROWS) || Q8_LANES);
    const int64_t strips = quant_buffer_floats(kmax), q8 = f->q8 ? (q8_work_bytes(m, kmax) + 3) / 4 : 0;
    const int64_t most = tiles > strips ? tiles : strips;
    f->stride = ((most > q8 ? most : q8) + 15) / 16 * 16; /* each thread's part 64-byte aligned */
    f->per_thread = aligned_alloc(64, sizeof(float) * (size_t)(f->stride * threads));
    if (f->tiles) f->xv = aligned_alloc(64, sizeof(uint16_t) * (size_t)(f->m_padded * f->kp));
    const int lanes = !f->tiles && m >= MIN_BLOCKED_ROWS;
    if (lanes) f->x_lanes = malloc(sizeof(float) * (size_t)(m * kmax));
    return f->per_thread != NULL && (!f->tiles || f->xv != NULL) && (!lanes || f->x_lanes != NULL);
}

static void projection_work_free(ProjectionWork *f) {
    free(f->per_thread), free(f->xv), free(f->x_lanes);
}

/* y (m, n) (+)= x (m, k) @ w.T, fast (on tiles, or in 8-bit integers) when the work was sized for it, else
 * exact: inside the OpenMP region, every thread with its id. */
static void project_step(const float *x, const Weights *w, float *y, int64_t m, int64_t k, int64_t n, int add,
                         ProjectionWork *f, int thread) {
    float *mine = f->per_thread + (int64_t)thread * f->stride;
#if Q8_GROUPED_BUILT
    if (is_grouped(w->type)) { /* only in the fast precision (the callers refuse it otherwise) */
#if FAST_AMX
        /* Q8_0 on the tiles where stored Q8_0 takes them; Q5_0 never (stored, no tile reads it either) */
        if (w->type == WEIGHTS_Q8_0_G16 && f->tiles && !q8_before_tiles(WEIGHTS_Q8_0, m)) {
            project_amx_grouped(x, w, y, m, k, n, add, f->xv, f->m_padded, (uint16_t *)mine,
                                mine + 2 * FAST_TILE * f->kp, thread);
            return;
        }
#endif
        if (thread == 0) q8_projections++;
        project_q8_grouped(x, w, y, m, k, n, add, mine);
        return;
    }
#endif
#if FAST_AMX
    if (f->tiles && !eight_lanes_only(w->type) && !(f->q8 && q8_before_tiles(w->type, m))) { /* quant_k.h's types: 8-bit x or exact (no x_lanes needed) */
        /* this projection's width, not the widest the buffers were sized for: past it, A rows and x tiles
         * would hold stale values (multiplied by zeros, but a stale NaN times zero is NaN) */
        const int64_t kp = (k + FAST_K - 1) / FAST_K * FAST_K;
        project_amx(x, w, y, m, k, n, add, f->xv, f->m_padded, kp, (uint16_t *)mine, mine + FAST_TILE * f->kp);
        return;
    }
#endif
#if Q8_DOTS
    if (f->q8 && q8_takes(w->type, m)) {
        if (thread == 0) q8_projections++;
        project_q8(x, w, y, m, k, n, add, mine);
        return;
    }
#endif
    project_weights(x, w, y, m, k, n, add, mine, f->x_lanes);
}

#endif
