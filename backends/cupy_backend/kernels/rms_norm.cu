// RMSNorm over rows of `hidden` elements: y = x / sqrt(mean(x^2) + eps) * w, accumulated in float.
// The fused variant first adds the residual (x + r, stored back into `residual` in the storage dtype) and
// normalises that stored sum, as the next layer's residual input and this layer's norm input must agree.
// Grid: (num_tokens). Block: a multiple of 32 threads, at most 1024. `out` may alias `input`.
// head_rms_norm (QK norm) normalises each Q and K head of the fused QKV rows in place, over head_dim elements, with
// the Q or the K weight. Grid: (num_tokens, num_heads + num_kv_heads). Block: one warp.
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

// Head h of the token's row: Q heads first, then K heads right after them (the fused QKV layout), so head h
// starts h * head_dim elements in either way.
template <typename T>
__device__ __forceinline__ void head_rms_norm(T* qkv, const T* __restrict__ q_weight,
                                              const T* __restrict__ k_weight, float eps, int num_heads,
                                              int head_dim, int stride) {
  const int h = blockIdx.y;
  T* x = qkv + static_cast<long long>(blockIdx.x) * stride + static_cast<long long>(h) * head_dim;
  const T* weight = h < num_heads ? q_weight : k_weight;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += ps::kWarpSize) {
    const float v = ps::to_float(x[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(ps::warp_sum(sum_sq) / head_dim + eps);
  for (int i = threadIdx.x; i < head_dim; i += ps::kWarpSize) {  // each lane rewrites what it read
    x[i] = ps::from_float<T>(ps::to_float(x[i]) * inv_rms * ps::to_float(weight[i]));
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
  }                                                                                                        \
  extern "C" __global__ void head_rms_norm_##SUFFIX(T* qkv, const T* q_weight, const T* k_weight, float eps, \
                                                    int num_heads, int head_dim, int stride) {             \
    ps_norm::head_rms_norm<T>(qkv, q_weight, k_weight, eps, num_heads, head_dim, stride);                  \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_RMS_NORM)
