/* y = x @ w.T for the few rows of a decode step, for the NumPy backend on the CPU.
 *
 * x: (m, k) activations, m small (one row per decoding sequence); w: (n, k) a weight matrix as stored, rows
 * contiguous; y: (m, n). A decode step is bound by reading the weights once, so w is streamed exactly once:
 * each tile of 8 weight rows is read from memory and then used, from cache, for every row of x. BLAS GEMM
 * instead packs w into panels first; for m between 2 and ~16 that copy costs more than the arithmetic
 * (OpenBLAS 0.3.31 here: m = 2 took 2.4x as long as m = 1).
 *
 * The reference is NumPy's `x @ w.T` (tests/backends/test_native_matmul.py); results differ from it only by
 * float32 summation order. The tiles are split across OpenMP threads; built without OpenMP, one thread.
 */
#include <stdint.h>

#include "simd.h"

#define TILE 8 /* weight rows per tile: 8 accumulators, one 8-way horizontal sum */

/* The dot products of one row of x with a tile of TILE weight rows: TILE independent FMA chains. */
static inline __attribute__((always_inline)) vec8 tile_dots(const vec8 *x, const vec8 *w, int64_t chunks) {
    vec8 acc[TILE];
    for (int j = 0; j < TILE; j++) acc[j] = x[0] * w[j * chunks];
    for (int64_t c = 1; c < chunks; c++)
        for (int j = 0; j < TILE; j++) acc[j] += x[c] * w[j * chunks + c];
    return hsum8(acc);
}

/* One weight row (the n % TILE rows past the last tile): two chains, for the FMA latency. */
static float row_dot(const vec8 *x, const vec8 *w, int64_t chunks) {
    vec8 even = {0}, odd = {0};
    int64_t c = 0;
    for (; c + 1 < chunks; c += 2) {
        even += x[c] * w[c];
        odd += x[c + 1] * w[c + 1];
    }
    if (c < chunks) even += x[c] * w[c];
    return hsum(even + odd);
}

/* Needs k % 8 == 0 (returns -2 otherwise, and for negative sizes); returns 0. */
int matmul_rows_f32(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n) {
    if (k <= 0 || k % LANES != 0 || m < 0 || n < 0) return -2;
    const int64_t chunks = k / LANES, tiles = n / TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const vec8 *tile = (const vec8 *)(w + t * TILE * k);
        for (int64_t i = 0; i < m; i++) {
            const vec8 dots = tile_dots((const vec8 *)(x + i * k), tile, chunks);
            __builtin_memcpy(y + i * n + t * TILE, &dots, sizeof dots);
        }
    }
    for (int64_t r = tiles * TILE; r < n; r++)
        for (int64_t i = 0; i < m; i++)
            y[i * n + r] = row_dot((const vec8 *)(x + i * k), (const vec8 *)(w + r * k), chunks);
    return 0;
}

/* 1 when built with OpenMP (the tiles shared among threads), 0 when built single-threaded. */
int built_with_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
