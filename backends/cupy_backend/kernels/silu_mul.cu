// SiLU-and-multiply for the MLP: input rows are [gate (d) | up (d)], output rows silu(gate) * up, in float.
// Grid: (num_tokens). Block: any multiple of 32 threads.
#include "common.cuh"

namespace ps_act {

template <typename T>
__device__ __forceinline__ void silu_mul(T* __restrict__ out, const T* __restrict__ input, int d) {
  const long long token = blockIdx.x;
  const T* gate = input + token * 2 * d;
  const T* up = gate + d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float g = ps::to_float(gate[i]);
    // g / (1 + e^-g) stays finite for every g: the denominator only overflows to +inf, giving -0.
    out[token * d + i] = ps::from_float<T>(g / (1.0f + expf(-g)) * ps::to_float(up[i]));
  }
}

}  // namespace ps_act

#define PS_DEFINE_SILU_MUL(SUFFIX, T)                                                         \
  extern "C" __global__ void silu_mul_##SUFFIX(T* out, const T* input, int d) {               \
    ps_act::silu_mul<T>(out, input, d);                                                       \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_SILU_MUL)
