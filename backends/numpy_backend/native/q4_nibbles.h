/* Q4_0 and Q4_1 blocks read in the order their nibbles lie in (AVX-512 builds: included where QUANT_WIDE).
 *
 * Spreading a block's 32 nibbles over 16-lane vectors in the weights' own order takes a byte-to-dword widening
 * per vector, and on Intel cores that widening, the table lookup (vpermps) and the scales' conversion and
 * broadcasts all issue on one port (port 5): a batch-1 step's Q4_1 projections read 13 GB/s, half what the
 * bus gives, bound by that port. Here the block's 16 bytes are broadcast to the four 128-bit lanes by the
 * load itself, and a per-lane shift (vpsrlvd, port 0) brings a different nibble to the bottom of each dword,
 * which is all vpermps reads of its index. Lane L (L = 4c + j) of the first vector holds nibble c of dword j,
 * of the second nibble c + 4: weight 4j + c/2 + 16 (c % 2) (+ 2 in the second) of the block. x is put in the
 * same order once per call (permute_nibble_rows), so each product pairs the same weight and activation as
 * before; only which lane sums it changes. A tile's scales are gathered and converted 16 blocks at a time
 * (tile_scales) and read back as broadcast loads. Together, a batch-1 step's projections 5.1 -> 4.3 ms
 * (bench.backend_step). The weights keep gguf's values.
 *
 * Every path over these types (tiles of 1-2 rows, strips of 3+, tail rows) sums in this order, so a row's
 * result still does not depend on its batch.
 */
#ifndef PAGEDSERVE_Q4_NIBBLES_H
#define PAGEDSERVE_Q4_NIBBLES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_wide.h"

#define SCALE_CHUNK 32 /* blocks whose scales a tile converts at once (2 KB of floats for its 8 rows), a multiple of 16 */

static inline int nibble_ordered(int32_t type) { return type == WEIGHTS_Q4_0 || type == WEIGHTS_Q4_1; }

/* The block weight (0..31) in each lane of the two vectors: dword j's nibble c is weight 4j + c/2 + 16 (c % 2)
 * (byte i holds weight i low, weight i + 16 high). */
static inline __m512i nibble_weights(int second) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i c = _mm512_add_epi32(_mm512_srli_epi32(lane, 2), _mm512_set1_epi32(second ? 4 : 0));
    const __m512i j = _mm512_and_si512(lane, _mm512_set1_epi32(3));
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(j, 2), _mm512_srli_epi32(c, 1)),
                            _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(1)), 4));
}

/* x's m rows (k % 32 == 0) in nibble order, into xp. */
static void permute_nibble_rows(const float *x, int64_t m, int64_t k, float *xp) {
    const __m512i first = nibble_weights(0), second = nibble_weights(1);
    for (int64_t c = 0; c < m * k; c += QBLOCK) {
        const __m512 lo = _mm512_loadu_ps(x + c), hi = _mm512_loadu_ps(x + c + 16);
        _mm512_storeu_ps(xp + c, _mm512_permutex2var_ps(lo, first, hi));
        _mm512_storeu_ps(xp + c + 16, _mm512_permutex2var_ps(lo, second, hi));
    }
}

static inline int64_t q4_block_bytes(int with_min) { return with_min ? 20 : 18; }

/* The block's 16 possible values as gguf computes them: d * q + m (two roundings, never one FMA) or d * (q - 8). */
static inline __attribute__((always_inline)) __m512 q4_table(__m512 d, __m512 m, int with_min) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if (!with_min) return _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), d); /* q - 8: exact */
    __m512 table = _mm512_mul_ps(iota, d);
    __asm__("" : "+v"(table));
    return _mm512_add_ps(table, m);
}

/* The 32 weights of the block at `block`, in nibble order, looked up in `table`. */
static inline __attribute__((always_inline)) void q4_nibbles(const uint8_t *block, int with_min, __m512 table,
                                                             __m512 out[2]) {
    const __m512i shifts = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m512i q = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(block + (with_min ? 4 : 2))));
    out[0] = _mm512_permutexvar_ps(_mm512_srlv_epi32(q, shifts), table);
    out[1] = _mm512_permutexvar_ps(_mm512_srlv_epi32(q, _mm512_add_epi32(shifts, _mm512_set1_epi32(16))), table);
}

/* Block b of a row, its scales converted here (the strips and the tail rows: once per block, not per x row). */
static inline __attribute__((always_inline)) void q4_block_nibbles(const uint8_t *row, int64_t b, int with_min,
                                                                   __m512 out[2]) {
    const uint8_t *block = row + b * q4_block_bytes(with_min);
    const float d = half_to_float(load_u16(block)), m = with_min ? half_to_float(load_u16(block + 2)) : 0.0f;
    q4_nibbles(block, with_min, q4_table(_mm512_set1_ps(d), _mm512_set1_ps(m), with_min), out);
}

/* A row of k weights, in nibble order, into out (the strips' buffer). */
static void dequantize_row_nibbles(const uint8_t *row, int with_min, int64_t k, float *out) {
    for (int64_t b = 0; b < k / QBLOCK; b++) {
        __m512 v[2];
        q4_block_nibbles(row, b, with_min, v);
        _mm512_storeu_ps(out + b * QBLOCK, v[0]);
        _mm512_storeu_ps(out + b * QBLOCK + 16, v[1]);
    }
}

/* One weight row against one row of x in nibble order (the tail rows). */
static float row_dot_nibbles(const float *xp, const uint8_t *row, int with_min, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QBLOCK; b++) {
        __m512 v[2];
        q4_block_nibbles(row, b, with_min, v);
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 32 * b + 16), v[1], _mm512_fmadd_ps(_mm512_loadu_ps(xp + 32 * b), v[0], acc));
    }
    return hsum_pairs(fold16(acc));
}

/* d and m of `count` blocks from b0 of the tile's TILE rows, as floats: dm[j][2 b] and dm[j][2 b + 1]. Each
 * row's pairs are gathered 16 blocks at a time and converted together (one by one, through scalar copies, the
 * scalar work competed with the vector ports). Q4_0 has no m: its "m" is the first two bytes of q, converted
 * and never used. */
static inline __attribute__((always_inline)) void tile_scales(const Weights *w, int64_t row0, int64_t b0,
                                                              int64_t count, int with_min,
                                                              float dm[TILE][2 * SCALE_CHUNK]) {
    const int64_t bytes = q4_block_bytes(with_min);
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)bytes));
    for (int j = 0; j < TILE; j++)
        for (int64_t b = 0; b < count; b += 16) {
            const __mmask16 valid = (__mmask16)(count - b >= 16 ? 0xffff : (1u << (count - b)) - 1);
            const __m512i pairs = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, offsets,
                                                              weights_row(w, row0 + j) + (b0 + b) * bytes, 1);
            _mm512_storeu_ps(dm[j] + 2 * b, _mm512_cvtph_ps(_mm512_castsi512_si256(pairs)));
            _mm512_storeu_ps(dm[j] + 2 * b + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(pairs, 1)));
        }
}

/* Tile t (TILE weight rows) for `pair` (1 or 2) rows of x in nibble order; with_min a constant where inlined.
 * Accumulated and summed as tile_pair_wide_t sums (16 lanes, store_tile_dots). */
static inline __attribute__((always_inline)) void tile_pair_nibbles_t(const float *xp, const Weights *w, float *y,
                                                                      int64_t pair, int64_t k, int64_t n, int64_t t,
                                                                      int add, const int with_min) {
    const int64_t blocks = k / QBLOCK, bytes = q4_block_bytes(with_min);
    const float *x1 = xp + (pair > 1 ? k : 0);
    __m512 acc0[TILE], acc1[TILE];
    for (int j = 0; j < TILE; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    Ahead ahead = next_tile_ahead(w, n, t, blocks);
    float dm[TILE][2 * SCALE_CHUNK];
    for (int64_t b0 = 0; b0 < blocks; b0 += SCALE_CHUNK) {
        const int64_t count = blocks - b0 < SCALE_CHUNK ? blocks - b0 : SCALE_CHUNK;
        tile_scales(w, t * TILE, b0, count, with_min, dm);
        for (int64_t b = b0; b < b0 + count; b++) {
            ahead_step(&ahead);
            const __m512 a0 = _mm512_loadu_ps(xp + 32 * b), a1 = _mm512_loadu_ps(xp + 32 * b + 16);
            const __m512 c0 = _mm512_loadu_ps(x1 + 32 * b), c1 = _mm512_loadu_ps(x1 + 32 * b + 16);
            for (int j = 0; j < TILE; j++) {
                const float *s = dm[j] + 2 * (b - b0);
                __m512 v[2];
                q4_nibbles(weights_row(w, t * TILE + j) + b * bytes, with_min,
                           q4_table(_mm512_set1_ps(s[0]), _mm512_set1_ps(s[1]), with_min), v);
                acc0[j] = _mm512_fmadd_ps(a1, v[1], _mm512_fmadd_ps(a0, v[0], acc0[j]));
                if (pair > 1) acc1[j] = _mm512_fmadd_ps(c1, v[1], _mm512_fmadd_ps(c0, v[0], acc1[j]));
            }
        }
    }
    store_tile_dots(acc0, acc1, y, pair, n, t, add);
}

/* Tile t for every row of x (in nibble order), two rows at a time. */
static void project_tile_nibbles(const float *xp, const Weights *w, float *y, int64_t m, int64_t k, int64_t n,
                                 int64_t t, int add) {
    for (int64_t i = 0; i < m; i += 2) {
        const int64_t pair = m - i < 2 ? m - i : 2;
        if (w->type == WEIGHTS_Q4_1) tile_pair_nibbles_t(xp + i * k, w, y + i * n, pair, k, n, t, add, 1);
        else tile_pair_nibbles_t(xp + i * k, w, y + i * n, pair, k, n, t, add, 0);
    }
}

#endif
