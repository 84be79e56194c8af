/* y = x @ w.T for the few rows of a decode step, for the NumPy backend on the CPU (the tile loop is in
 * matmul.h, shared with the fused step).
 *
 * The reference is NumPy's `x @ w.T` (tests/backends/test_native_matmul.py); results differ from it only by
 * float32 summation order. The tiles are split across OpenMP threads; built without OpenMP, one thread.
 */
#include "matmul.h"

/* Needs k % 8 == 0 (returns -2 otherwise, and for negative sizes); returns 0. */
int matmul_rows_f32(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n) {
    if (k <= 0 || k % LANES != 0 || m < 0 || n < 0) return -2;
#pragma omp parallel
    project_rows(x, w, y, m, k, n, 0);
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
