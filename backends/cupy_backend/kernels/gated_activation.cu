// The MLP's gated activation: input rows are [gate (d) | up (d)], output rows act(gate) * up, in float. act is
// SiLU (SwiGLU) or GELU's tanh approximation (GeGLU), as the architecture's `activation` says.
// Grid: (num_tokens). Block: any multiple of 32 threads.
#include "common.cuh"

namespace ps_act {

// g / (1 + e^-g) stays finite for every g: the denominator only overflows to +inf, giving -0.
struct Silu {
  static __device__ __forceinline__ float apply(float g) { return g / (1.0f + expf(-g)); }
};

// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), as Gemma's gelu_pytorch_tanh.
struct GeluTanh {
  static __device__ __forceinline__ float apply(float g) {
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + tanhf(inner));
  }
};

template <typename Act, typename T>
__device__ __forceinline__ void gated(T* __restrict__ out, const T* __restrict__ input, int d) {
  const long long token = blockIdx.x;
  const T* gate = input + token * 2 * d;
  const T* up = gate + d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    out[token * d + i] = ps::from_float<T>(Act::apply(ps::to_float(gate[i])) * ps::to_float(up[i]));
  }
}

}  // namespace ps_act

#define PS_DEFINE_GATED(SUFFIX, T)                                                            \
  extern "C" __global__ void silu_mul_##SUFFIX(T* out, const T* input, int d) {               \
    ps_act::gated<ps_act::Silu, T>(out, input, d);                                            \
  }                                                                                           \
  extern "C" __global__ void gelu_tanh_mul_##SUFFIX(T* out, const T* input, int d) {          \
    ps_act::gated<ps_act::GeluTanh, T>(out, input, d);                                        \
  }
PS_FOR_EACH_DTYPE(PS_DEFINE_GATED)
