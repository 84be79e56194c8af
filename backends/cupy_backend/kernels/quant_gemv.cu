// y (rows, n) = x (rows, k) @ W.T for decode-sized batches (rows <= kMaxRows), with W (n, k) kept as the file
// stores it (quant_blocks.cuh) and never widened in memory: each weight is read once from global memory,
// dequantized in registers and used for every row of x. Products accumulate in float; x is read in the
// storage dtype and y written in it (the _logits variants write float, for sampling).
//
// Grid: (ceil(n / (kWarps * kWarpRows))). Block: kWarps warps. Warp w of block b owns the kWarpRows columns of
// y starting at (b * kWarps + w) * kWarpRows (rows of W). Its lanes take the half blocks of those rows in turn
// (lane i: half blocks i, i + 32, ...), so a warp reads contiguous bytes; a warp reduction sums each
// (row of x, column) at the end. x is contiguous with rows of k elements, k a whole number of the type's blocks (32 or 256 weights).
#include "quant_blocks.cuh"

namespace ps_gemv {

constexpr int kWarps = 4;     // launch.QUANT_GEMV_WARPS
constexpr int kWarpRows = 2;  // launch.QUANT_GEMV_WARP_ROWS: rows of W per warp, sharing each load of x
constexpr int kMaxRows = 8;   // launch.QUANT_GEMV_MAX_ROWS: rows of x per launch

using Acc = float[kMaxRows][kWarpRows];

// Eight consecutive elements of x widened to float, in 16-byte loads: k and every run start are multiples of
// 8 elements, so p is 16-byte aligned when x is.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* out) {
  constexpr int kVec = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < ps_quant::kRun; i += kVec) ps::load_floats<T, kVec>(p + i, out + i);
}

// acc[m][r] += x[m] . w[r] over one half block; x points at the block's first column in row 0.
template <typename T>
__device__ __forceinline__ void accumulate(Acc& acc, const ps_quant::Half (&w)[kWarpRows], const T* x, int rows,
                                           int k) {
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) break;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
      float xv[ps_quant::kRun];
      load8(x + static_cast<long long>(m) * k + w[0].start[run], xv);
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
#pragma unroll
        for (int i = 0; i < ps_quant::kRun; ++i) acc[m][r] += xv[i] * w[r].w[run][i];
      }
    }
  }
}

// Warp sums of acc; lane m * kWarpRows + r writes y[m, first + r]. `rows` is the same for every lane, so the
// whole warp takes part in each shuffle.
template <typename OutT>
__device__ __forceinline__ void write_sums(OutT* y, Acc& acc, int rows, int n, int first) {
  const int lane = threadIdx.x % ps::kWarpSize;
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) break;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const float sum = ps::warp_sum(acc[m][r]);
      if (lane == m * kWarpRows + r && first + r < n) {
        y[static_cast<long long>(m) * n + first + r] = ps::from_float<OutT>(sum);
      }
    }
  }
}

template <typename Q, typename T, typename OutT>
__device__ __forceinline__ void gemv(OutT* __restrict__ y, const T* __restrict__ x,
                                     const unsigned char* __restrict__ w, int rows, int n, int k) {
  const int lane = threadIdx.x % ps::kWarpSize;
  const int first = (static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / ps::kWarpSize) * kWarpRows;
  if (first >= n) return;  // the whole warp leaves: none of its lanes is left waiting in a shuffle
  const long long row_bytes = ps_quant::row_bytes<Q>(k);
  const int items = k / ps_quant::kBlock * ps_quant::kHalves;
  Acc acc = {};
  for (int item = lane; item < items; item += ps::kWarpSize) {
    const int block = item / ps_quant::kHalves, h = item % ps_quant::kHalves;
    ps_quant::Half wh[kWarpRows];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      // A ragged n: the last warp reads row n - 1 again in place of the missing rows and never writes them.
      const long long row = ps::min_int(first + r, n - 1);
      wh[r] = ps_quant::half_at<Q>(w + row * row_bytes, block, h);
    }
    accumulate(acc, wh, x + block * ps_quant::kBlock, rows, k);
  }
  write_sums(y, acc, rows, n, first);
}

}  // namespace ps_gemv

#define PS_QUANT_GEMV(NAME, Q, SUFFIX, T)                                                                    \
  extern "C" __global__ void quant_gemv_##NAME##_##SUFFIX(T* y, const T* x, const unsigned char* w, int rows,  \
                                                         int n, int k) {                                       \
    ps_gemv::gemv<ps_quant::Q, T, T>(y, x, w, rows, n, k);                                                     \
  }                                                                                                            \
  extern "C" __global__ void quant_gemv_logits_##NAME##_##SUFFIX(float* y, const T* x, const unsigned char* w, \
                                                                int rows, int n, int k) {                      \
    ps_gemv::gemv<ps_quant::Q, T, float>(y, x, w, rows, n, k);                                                 \
  }
#define PS_DEFINE_QUANT_GEMV(SUFFIX, T) PS_FOR_EACH_QUANT(PS_QUANT_GEMV, SUFFIX, T)
PS_FOR_EACH_DTYPE(PS_DEFINE_QUANT_GEMV)
