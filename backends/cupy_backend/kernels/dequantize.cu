// Rows of a weight matrix kept as the file stores it (quant_blocks.cuh), dequantized into the storage dtype:
// out row i = W row ids[i]. Serves the embedding lookup (only the step's tokens' rows of a quantized embedding)
// and the transient dense copy through which a batch too large for quant_gemv.cu reaches the GEMM.
// Each value is gguf's float, rounded once to the storage dtype: what a dense upload of the same matrix holds.
// Grid: (number of ids). Block: any multiple of 32 threads, over the row's half blocks.
#include "quant_blocks.cuh"

namespace ps_dequant {

template <typename Q, typename T>
__device__ __forceinline__ void dequantize_rows(T* __restrict__ out, const unsigned char* __restrict__ w,
                                                const int* __restrict__ ids, int k) {
  const long long i = blockIdx.x;
  const unsigned char* row = w + ids[i] * ps_quant::row_bytes<Q>(k);
  T* dst = out + i * k;
  for (int item = threadIdx.x; item < k / ps_quant::kBlock * ps_quant::kHalves; item += blockDim.x) {
    const int block = item / ps_quant::kHalves;
    const ps_quant::Half half = ps_quant::half_at<Q>(row, block, item % ps_quant::kHalves);
#pragma unroll
    for (int run = 0; run < 2; ++run) {
#pragma unroll
      for (int j = 0; j < ps_quant::kRun; ++j) {
        dst[block * ps_quant::kBlock + half.start[run] + j] = ps::from_float<T>(half.w[run][j]);
      }
    }
  }
}

}  // namespace ps_dequant

#define PS_DEQUANTIZE(NAME, Q, SUFFIX, T)                                                                     \
  extern "C" __global__ void dequantize_##NAME##_##SUFFIX(T* out, const unsigned char* w, const int* ids, int k) { \
    ps_dequant::dequantize_rows<ps_quant::Q, T>(out, w, ids, k);                                                 \
  }
#define PS_DEFINE_DEQUANTIZE(SUFFIX, T) PS_FOR_EACH_QUANT(PS_DEQUANTIZE, SUFFIX, T)
PS_FOR_EACH_DTYPE(PS_DEFINE_DEQUANTIZE)
