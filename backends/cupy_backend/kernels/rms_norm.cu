// RMSNorm over rows of `hidden` elements: y = x / sqrt(mean(x^2) + eps) * w, accumulated in float.
// The fused variant first adds the residual (x + r, stored back into `residual` in the storage dtype) and
// normalises that stored sum, as the next layer's residual input and this layer's norm input must agree.
// Grid: (num_tokens). Block: a multiple of 32 threads, at most 1024. `out` may alias `input`.
#include "common.cuh"

namespace ps_norm {

template <typename T>
__device__ __forceinline__ void rms_norm(T* out, const T* input, const T* __restrict__ weight, float eps,
                                         int hidden) {
  const long long row = static_cast<long long>(blockIdx.x) * hidden;
  const T* x = input + row;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = ps::to_float(x[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(ps::block_sum(sum_sq) / hidden + eps);
  // Each thread rewrites only the elements it read itself, which is what makes out == input safe.
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[row + i] = ps::from_float<T>(ps::to_float(x[i]) * inv_rms * ps::to_float(weight[i]));
  }
}

template <typename T>
__device__ __forceinline__ void fused_add_rms_norm(T* out, const T* input, T* residual,
                                                   const T* __restrict__ weight, float eps, int hidden) {
  const long long row = static_cast<long long>(blockIdx.x) * hidden;
  T* r = residual + row;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const T sum = ps::from_float<T>(ps::to_float(input[row + i]) + ps::to_float(r[i]));
    r[i] = sum;
    const float v = ps::to_float(sum);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(ps::block_sum(sum_sq) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[row + i] = ps::from_float<T>(ps::to_float(r[i]) * inv_rms * ps::to_float(weight[i]));
  }
}

}  // namespace ps_norm

#define PS_DEFINE_RMS_NORM(SUFFIX, T)                                                                      \
  extern "C" __global__ void rms_norm_##SUFFIX(T* out, const T* input, const T* weight, float eps,         \
                                               int hidden) {                                               \
    ps_norm::rms_norm<T>(out, input, weight, eps, hidden);                                                 \
  }                                                                                                        \
  extern "C" __global__ void fused_add_rms_norm_##SUFFIX(T* out, const T* input, T* residual,              \
                                                         const T* weight, float eps, int hidden) {         \
    ps_norm::fused_add_rms_norm<T>(out, input, residual, weight, eps, hidden);                             \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_RMS_NORM)
