/* y = x @ w.T for the few rows of a decode step, for the NumPy backend on the CPU (the tile loop is in
 * matmul.h, shared with the fused step), with w float32 or as a GGUF file stores it (quant_matmul.h); and the
 * dequantization of a whole stored matrix, for the steps too large for these kernels.
 *
 * The reference is NumPy's `x @ w.T` (tests/backends/test_native_matmul.py) on gguf's dequantization
 * (test_native_quant.py); results differ from it only by float32 summation order. The tiles are split across
 * OpenMP threads; built without OpenMP, one thread.
 */
#include "fast_matmul.h"
#include "threads.h"

/* Needs k % 8 == 0 (returns -2 otherwise, and for negative sizes); returns 0. */
int matmul_rows_f32(const float *x, const float *w, float *y, int64_t m, int64_t k, int64_t n) {
    if (k <= 0 || k % LANES != 0 || m < 0 || n < 0) return -2;
#pragma omp parallel
    project_rows(x, w, y, m, k, n, 0);
    return 0;
}

/* The same for w (n, k) as stored, `type` one of quant.h's; `fast`: the fast precision (fast_matmul.h). -2 for
 * sizes or a type the kernels do not take, -1 out of memory. */
int matmul_weights_f32(const float *x, const uint8_t *data, int64_t row_bytes, int32_t type, float *y, int64_t m,
                       int64_t k, int64_t n, int fast) {
    if (k <= 0 || m < 0 || n < 0 || !weights_supported(type, k)) return -2;
    if (is_grouped(type) && (!fast || n % 16 != 0)) return -2; /* q8_grouped.h's kernels alone read them */
    const Weights w = {data, row_bytes, type};
    const int threads = MAX_THREADS;
    ProjectionWork work;
    const int ok = projection_work_alloc(&work, m, k, threads, fast);
    if (ok) {
#pragma omp parallel num_threads(threads)
        project_step(x, &w, y, m, k, n, 0, &work, THREAD_ID);
    }
    projection_work_free(&work);
    return ok ? 0 : -1;
}

/* 1 when the fast precision runs batches on AMX tiles in this process, 0 when it is the exact one. */
int fast_uses_tiles(void) { return fast_uses_amx(); }

/* 1 when the fast precision runs steps of 1-3 rows on Q4_0 / Q4_1 / Q5_0 / Q5_1 / K-quant weights with 8-bit x
 * (q8_dots.h: AVX2 builds, and AArch64 builds with the dot product extension), 0 when they are exact. */
int fast_small_steps(void) { return Q8_DOTS; }

/* 1 when steps of 4-64 rows take the 8-bit path too, where no tile reads the weights (AVX-512 builds). */
int fast_wide_steps(void) { return Q8_DOTS && Q8_CHUNK > 3; }

/* 1 when Q8_0 and the K-quants take the 8-bit path with x in lanes from 8 rows, past 64 rows too (AVX-512 VNNI). */
int fast_lane_steps(void) { return Q8_LANES; }

/* 1 when the fast precision reads Q5_0 and Q8_0 regrouped 16 rows at a time (q8_grouped.h: AVX-512 VNNI). */
int fast_grouped_q8(void) { return Q8_GROUPED_BUILT; }

/* How many projections have run the 8-bit small steps in this process (0 without them). */
int64_t fast_small_steps_run(void) {
#if Q8_DOTS
    return q8_projections;
#else
    return 0;
#endif
}

/* out (n, k) float32 = the stored matrix, rows shared among the threads; -2 as matmul_weights_f32. */
int dequantize_f32(const uint8_t *data, int64_t row_bytes, int32_t type, float *out, int64_t n, int64_t k) {
    if (k <= 0 || n < 0 || !weights_supported(type, k) || is_grouped(type)) return -2;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++) dequantize_any_row(data + r * row_bytes, type, k, out + r * k);
    return 0;
}

/* 1 when stored weights are summed in 16 lanes (AVX-512, quant_wide.h), 0 when in matmul.h's 8 (bit for bit the
 * float32 copy's results). */
int quant_sums_wide(void) { return QUANT_WIDE; }

/* 1 when built with OpenMP (the tiles shared among threads), 0 when built single-threaded. */
int built_with_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
