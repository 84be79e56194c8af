// y (rows, n) = x (rows, k) @ W.T for batches past the GEMV's rows (prefill chunks, large decode batches), with
// W (n, k) kept as the file stores it (quant_blocks.cuh): no dense copy of the matrix is ever written. Each
// block dequantizes its tile of W into shared memory, rounded once to the storage dtype (the value a dense
// copy would hold), and multiplies it with x's tile there; products accumulate in float.
//
// Grid: (ceil(rows / kTileRows), ceil(n / kTileCols)). Block: kThreads. The row tiles vary fastest, so the
// blocks that read the same tile of W run together and all but the first find its bytes in L2: W comes from
// memory about once however many rows there are. A block owns a kTileRows x kTileCols tile of y and walks k
// in steps of one 32-weight block (a K-quant's sub-block): each thread loads its share of the next step into
// registers (Staged: x's 16-byte vectors t, t + kThreads, ..., and half block t % 2 of W's tile row t / 2,
// dequantized), the block multiplies the current step's tiles, and the thread then stores its share into the
// other half of a double buffer. The loads are in flight during the products, and one barrier a step suffices.
//
// The product: float16 / bfloat16 on the tensor cores (WMMA 16 x 16 x 16, sm_80 and later): warp w holds
// the 32 x 32 quarter (w / 2, w % 2) of the tile as 2 x 2 accumulators. float32, or a GPU without them,
// on the CUDA cores: thread t holds rows t / 8 + 16 i and columns t % 8 + 8 j. Either way the results pass
// through a float tile in shared memory, which the block writes out row by row.
#include "quant_blocks.cuh"

// PS_NO_TENSOR_CORES: the build NVRTC falls back to where no header directory has <mma.h> (source.option_sets),
// which the backend reports; the header is included unconditionally otherwise, so a missing one fails the
// build that lacks it instead of quietly leaving the tensor cores out.
#if defined(CUDA_EMU)
#define PS_TENSOR_CORES 1  // the emulation's nvcuda::wmma
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PS_NO_TENSOR_CORES)
#include <mma.h>
#define PS_TENSOR_CORES 1
#else
#define PS_TENSOR_CORES 0
#endif

namespace ps_gemm {

constexpr int kTileRows = 64;  // launch.QUANT_GEMM_TILE_ROWS
constexpr int kTileCols = 64;  // launch.QUANT_GEMM_TILE_COLS
constexpr int kThreads = 128;  // launch.QUANT_GEMM_THREADS
constexpr int kStep = ps_quant::kBlock;
constexpr int kOutLd = kTileCols + 4;  // the float tile's row: 16-byte aligned, rows off by 4 banks

// A step's x and W tiles: rows of kStep elements and 16 bytes of padding (rows stay 16-byte aligned for the
// vector stores, and a WMMA load's rows fall on different banks).
template <typename T>
struct StepTiles {
  static constexpr int kLd = kStep + 16 / static_cast<int>(sizeof(T));
  T x[kTileRows][kLd];
  T w[kTileCols][kLd];
};

template <typename T>
union alignas(32) Shared {
  StepTiles<T> step[2];
  float out[kTileRows][kOutLd];  // used only after the last step's products
};

template <typename T>
constexpr bool uses_tensor_cores() {
#if PS_TENSOR_CORES
  return sizeof(T) == 2;
#else
  return false;
#endif
}

// Where a block's tile starts, and the problem's size.
struct Tile {
  int row0, col0, rows, n, k;
};

// What one thread brings to a step's tiles, held in registers between the global loads and the shared-memory
// stores so that the loads of step s + 1 are in flight while step s is multiplied: its 16-byte vectors of x's
// tile, and its half block of W's tile row, dequantized.
template <typename T>
struct Staged {
  static constexpr int kVec = 16 / sizeof(T), kPerRow = kStep / kVec;
  static constexpr int kVectors = kTileRows * kPerRow / kThreads;
  ps::Vec<T, kVec> x[kVectors];
  ps_quant::Half w;

  // Step s: x's vectors t, t + kThreads, ... (zeros for rows past the batch), and half block t % 2 of W's tile
  // row t / 2 (a ragged n reads row n - 1 again; its columns of y are never written).
  template <typename Q>
  __device__ __forceinline__ void load(const T* __restrict__ xs, const unsigned char* __restrict__ ws, const Tile& t,
                                       int s) {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = threadIdx.x + i * kThreads, r = v / kPerRow, c = v % kPerRow * kVec;
      x[i] = {};
      if (t.row0 + r < t.rows) {
        const T* at = xs + static_cast<long long>(t.row0 + r) * t.k + s * kStep + c;
        x[i] = *reinterpret_cast<const ps::Vec<T, kVec>*>(at);
      }
    }
    const long long row = ps::min_int(t.col0 + static_cast<int>(threadIdx.x) / ps_quant::kHalves, t.n - 1);
    w = ps_quant::half_at<Q>(ws + row * ps_quant::row_bytes<Q>(t.k), s, threadIdx.x % ps_quant::kHalves);
  }

  // Into the step's tiles, W rounded to the storage dtype.
  __device__ __forceinline__ void store(StepTiles<T>& tiles) const {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = threadIdx.x + i * kThreads;
      *reinterpret_cast<ps::Vec<T, kVec>*>(&tiles.x[v / kPerRow][v % kPerRow * kVec]) = x[i];
    }
    const int r = threadIdx.x / ps_quant::kHalves;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
#pragma unroll
      for (int j = 0; j < ps_quant::kRun; ++j) tiles.w[r][w.start[run] + j] = ps::from_float<T>(w.w[run][j]);
    }
  }
};
static_assert(kThreads == kTileCols * ps_quant::kHalves, "Staged: one half block of W per thread");

// The CUDA cores' product: thread t's 4 x 8 sums.
struct CoreSums {
  float v[4][8] = {};

  template <typename T>
  __device__ __forceinline__ void add(const StepTiles<T>& tiles) {
    const int tr = threadIdx.x / 8, tc = threadIdx.x % 8;
#pragma unroll 4
    for (int kk = 0; kk < kStep; ++kk) {
      float a[4], b[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = ps::to_float(tiles.x[tr + 16 * i][kk]);
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = ps::to_float(tiles.w[tc + 8 * j][kk]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[i][j] += a[i] * b[j];
      }
    }
  }

  __device__ __forceinline__ void store(float (&out)[kTileRows][kOutLd]) const {
    const int tr = threadIdx.x / 8, tc = threadIdx.x % 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[tr + 16 * i][tc + 8 * j] = v[i][j];
    }
  }
};
static_assert(kThreads == 16 * 8 && kTileRows == 4 * 16 && kTileCols == 8 * 8, "CoreSums' thread layout");

#if PS_TENSOR_CORES
namespace wmma = nvcuda::wmma;

// The tensor cores' product: warp w's 2 x 2 accumulators of 16 x 16.
template <typename T>
struct TensorSums {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> v[2][2];

  __device__ __forceinline__ TensorSums() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(v[i][j], 0.0f);
    }
  }

  // x's rows are A (row-major); W's rows are B's columns (B = W.T, column-major).
  __device__ __forceinline__ void add(const StepTiles<T>& tiles) {
    constexpr int kLd = StepTiles<T>::kLd;
    const int warp = threadIdx.x / ps::kWarpSize, r0 = 32 * (warp / 2), c0 = 32 * (warp % 2);
#pragma unroll
    for (int kk = 0; kk < kStep; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &tiles.x[r0 + 16 * i][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &tiles.w[c0 + 16 * j][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(v[i][j], a[i], b[j], v[i][j]);
      }
    }
  }

  __device__ __forceinline__ void store(float (&out)[kTileRows][kOutLd]) const {
    const int warp = threadIdx.x / ps::kWarpSize, r0 = 32 * (warp / 2), c0 = 32 * (warp % 2);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::store_matrix_sync(&out[r0 + 16 * i][c0 + 16 * j], v[i][j], kOutLd, wmma::mem_row_major);
      }
    }
  }
};
static_assert(kThreads == 4 * ps::kWarpSize && kTileRows == 64 && kTileCols == 64, "TensorSums' warp layout");

template <bool kTensor, typename T>
struct Pick {
  using type = CoreSums;
};
template <typename T>
struct Pick<true, T> {
  using type = TensorSums<T>;
};
template <typename T>
using Sums = typename Pick<uses_tensor_cores<T>(), T>::type;
#else
template <typename T>
using Sums = CoreSums;
#endif

// The float tile into y, consecutive threads on consecutive columns.
template <typename OutT>
__device__ __forceinline__ void write_out(OutT* __restrict__ y, const float (&out)[kTileRows][kOutLd], const Tile& t) {
  for (int i = threadIdx.x; i < kTileRows * kTileCols; i += kThreads) {
    const int r = i / kTileCols, c = i % kTileCols;
    if (t.row0 + r < t.rows && t.col0 + c < t.n) {
      y[static_cast<long long>(t.row0 + r) * t.n + t.col0 + c] = ps::from_float<OutT>(out[r][c]);
    }
  }
}

template <typename Q, typename T, typename OutT>
__device__ __forceinline__ void gemm(OutT* __restrict__ y, const T* __restrict__ x, const unsigned char* __restrict__ w,
                                     int rows, int n, int k) {
  __shared__ Shared<T> smem;
  const Tile t{static_cast<int>(blockIdx.x) * kTileRows, static_cast<int>(blockIdx.y) * kTileCols, rows, n, k};
  const int steps = k / kStep;
  Sums<T> sums;
  Staged<T> next;
  next.template load<Q>(x, w, t, 0);
  next.store(smem.step[0]);
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) next.template load<Q>(x, w, t, s + 1);
    sums.add(smem.step[s % 2]);
    if (s + 1 < steps) next.store(smem.step[(s + 1) % 2]);
    __syncthreads();  // the step's tiles are read, and the next one's written
  }
  sums.store(smem.out);
  __syncthreads();
  write_out(y, smem.out, t);
}

}  // namespace ps_gemm

#define PS_QUANT_GEMM(NAME, Q, SUFFIX, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(ps_gemm::kThreads)                                            \
      quant_gemm_##NAME##_##SUFFIX(T* y, const T* x, const unsigned char* w, int rows, int n, int k) {        \
    ps_gemm::gemm<ps_quant::Q, T, T>(y, x, w, rows, n, k);                                                    \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(ps_gemm::kThreads)                                            \
      quant_gemm_logits_##NAME##_##SUFFIX(float* y, const T* x, const unsigned char* w, int rows, int n, int k) { \
    ps_gemm::gemm<ps_quant::Q, T, float>(y, x, w, rows, n, k);                                                \
  }
#define PS_DEFINE_QUANT_GEMM(SUFFIX, T) PS_FOR_EACH_QUANT(PS_QUANT_GEMM, SUFFIX, T)
PS_FOR_EACH_DTYPE(PS_DEFINE_QUANT_GEMM)
