// nvcuda::wmma for the CPU emulation: the 16 x 16 x 16 shape with 16-bit operands and float accumulators,
// which is what the kernels use.
//
// The hardware's fragment layout is unspecified (a kernel may only load, store, fill and multiply fragments),
// so here every lane's matrix_a / matrix_b fragment holds the whole 16 x 16 operand, and an accumulator holds
// 8 of its tile's 256 elements, as each lane's does on the GPU: lane l owns elements 8l .. 8l + 7 in row-major
// order. A store therefore writes the tile only when every lane of the warp takes part.
//
// Every operation is warp-collective, as on the GPU: the lanes meet at a barrier and must pass the same pointer
// and leading dimension (a divergent or per-lane call fails). The CUDA documentation's preconditions are
// checked too: the pointer 256-bit (32-byte) aligned, ldm a multiple of 16 bytes, 16-bit operands. As on the
// GPU, a lane may read what other lanes stored only after a barrier (__syncwarp or __syncthreads).
#pragma once

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

constexpr int kTile = 16;
constexpr int kLaneElements = kTile * kTile / ::cuda_emu::kWarpSize;

template <typename Use>
constexpr int fragment_elements() {
  return std::is_same_v<Use, accumulator> ? kLaneElements : kTile * kTile;
}

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == kTile && N == kTile && K == kTile, "only the 16 x 16 x 16 shape is emulated");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "operands are __half or __nv_bfloat16 (float ones need tf32), accumulators float");
  static constexpr int num_elements = fragment_elements<Use>();
  T x[num_elements];
};

}  // namespace nvcuda::wmma

namespace cuda_emu {

inline float wmma_value(float v) { return v; }
inline float wmma_value(__half v) { return __half2float(v); }
inline float wmma_value(__nv_bfloat16 v) { return __bfloat162float(v); }

// The lanes' common pointer and leading dimension, checked; a barrier over the warp.
inline void wmma_collective(const void* p, unsigned ldm, std::size_t element_bytes) {
  struct Call {
    const void* p;
    unsigned long long ldm;
  };
  const Call mine{p, ldm};
  const Call first = exchange(mine, 0);
  if (first.p != mine.p || first.ldm != mine.ldm) fail("wmma: the warp's lanes passed different arguments");
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) fail("wmma: pointer not 32-byte aligned");
  if ((ldm * element_bytes) % 16 != 0) fail("wmma: ldm not a multiple of 16 bytes");
}

// Element (r, c) of a tile stored from p with leading dimension ldm.
template <typename P>
P& wmma_at(P* p, unsigned ldm, bool row_major, int r, int c) {
  return row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <typename Layout>
constexpr bool is_row_major() {
  return std::is_same_v<Layout, nvcuda::wmma::row_major>;
}

}  // namespace cuda_emu

namespace nvcuda::wmma {

// matrix_a (M x K) or matrix_b (K x N): the whole operand in every lane, element (r, c) at x[r * 16 + c].
template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout_t");
  ::cuda_emu::wmma_collective(p, ldm, sizeof(T));
  for (int r = 0; r < kTile; ++r) {
    for (int c = 0; c < kTile; ++c) {
      f.x[r * kTile + c] = ::cuda_emu::wmma_at(p, ldm, ::cuda_emu::is_row_major<Layout>(), r, c);
    }
  }
}

// Lane l's elements: tile elements 8l .. 8l + 7 in row-major order.
inline int accumulator_index(int e) { return int(::cuda_emu::tls.lane) * kLaneElements + e; }

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  ::cuda_emu::wmma_collective(p, ldm, sizeof(float));
  for (int e = 0; e < kLaneElements; ++e) {
    const int i = accumulator_index(e);
    f.x[e] = ::cuda_emu::wmma_at(p, ldm, l == mem_row_major, i / kTile, i % kTile);
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  ::cuda_emu::wmma_collective(p, ldm, sizeof(float));
  for (int e = 0; e < kLaneElements; ++e) {
    const int i = accumulator_index(e);
    ::cuda_emu::wmma_at(p, ldm, l == mem_row_major, i / kTile, i % kTile) = f.x[e];
  }
}

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
  for (T& e : f.x) e = v;
}

// d = a b + c, each of the lane's elements summed in float from c over k in order; the products of 16-bit
// values are exact in float. d may be c.
template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  ::cuda_emu::my_warp().bar.arrive_and_wait();
  float sums[kLaneElements];
  for (int e = 0; e < kLaneElements; ++e) {
    const int i = accumulator_index(e), r = i / kTile, col = i % kTile;
    float sum = c.x[e];
    for (int k = 0; k < kTile; ++k) {
      sum += ::cuda_emu::wmma_value(a.x[r * kTile + k]) * ::cuda_emu::wmma_value(b.x[k * kTile + col]);
    }
    sums[e] = sum;
  }
  for (int e = 0; e < kLaneElements; ++e) d.x[e] = sums[e];
}

}  // namespace nvcuda::wmma
