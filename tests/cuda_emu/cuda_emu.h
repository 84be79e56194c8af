// CPU emulation of the CUDA execution model: enough of it for the kernels in backends/cupy_backend/kernels to
// compile unchanged with g++ (C++20) and run on host memory. The blocks of a grid run one after another on the
// same blockDim CUDA threads, which is what makes `__shared__` as a function-local `static` sound.
// `__syncthreads` is a barrier over the block, a warp shuffle is a write to a per-warp exchange buffer, one
// barrier phase over the warp, and a read; dynamic shared memory comes from EXTERN_SHARED.
//
// Each CUDA thread is a fiber on the calling thread (ucontext): a barrier yields until the block's (or warp's)
// last live thread arrives, so a phase costs one user-space switch per thread. As std::threads, every phase
// woke blockDim threads through the kernel and a quantized GEMV launch took a second on two cores. Running
// each thread up to its next barrier is one of the schedules CUDA allows, so results still check the kernels;
// a barrier some thread never reaches fails at once instead of hanging. The ThreadSanitizer build
// (CUDA_EMU_THREADS, set under -fsanitize=thread) keeps one std::thread per CUDA thread: races need real threads.
#pragma once

#define CUDA_EMU 1

#if !defined(CUDA_EMU_THREADS) && defined(__SANITIZE_THREAD__)
#define CUDA_EMU_THREADS 1
#endif

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#if !CUDA_EMU_THREADS
#include <sys/mman.h>
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

// ---------------------------------------------------------------------------------------------------------
// Built-in vector types (only what the kernels use).
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

#include "cuda_emu_fp16.h"

namespace cuda_emu {

constexpr int kWarpSize = 32;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

#if CUDA_EMU_THREADS
using Barrier = std::barrier<>;
#else
inline void fiber_wait();  // below: lets the block's other fibers run
inline void fiber_progress();

// std::barrier's arrive_and_wait / arrive_and_drop for fibers of one thread: no locks, the waiters yield.
class Barrier {
 public:
  explicit Barrier(std::ptrdiff_t expected) : expected_(expected) {}
  void arrive_and_wait() {
    const unsigned long long phase = phase_;
    fiber_progress();
    if (++arrived_ == expected_) {
      complete();
      return;
    }
    while (phase_ == phase) fiber_wait();
  }
  // Arrives for this phase and leaves every later one.
  void arrive_and_drop() {
    fiber_progress();
    if (arrived_ == --expected_) complete();
  }

 private:
  void complete() {
    arrived_ = 0;
    ++phase_;
  }
  std::ptrdiff_t expected_, arrived_ = 0;
  unsigned long long phase_ = 0;
};
#endif

// One warp: a barrier over its live lanes and two banks of per-lane shuffle slots. Consecutive shuffles use
// alternate banks, so one barrier phase per shuffle is enough: a lane rewrites a bank only after the next
// shuffle's barrier, which every lane reaches only after reading that bank.
struct Warp {
  explicit Warp(int lanes) : size(lanes), bar(lanes) {}
  int size;
  Barrier bar;
  alignas(16) unsigned char slots[2][kWarpSize][16];
};

// What one thread block shares. Rebuilt between blocks so every block starts with full barrier counts.
struct Block {
  Block(unsigned threads, std::size_t smem_bytes) : sync(threads), smem(smem_bytes / 16 + 1) {
    for (unsigned first = 0; first < threads; first += kWarpSize) {
      const unsigned lanes = threads - first < unsigned(kWarpSize) ? threads - first : unsigned(kWarpSize);
      warps.push_back(std::make_unique<Warp>(int(lanes)));
    }
    // 0xFF bytes are NaN as float, half and bfloat16: reading shared memory before writing it shows up.
    std::memset(static_cast<void*>(smem.data()), 0xFF, smem.size() * sizeof(Chunk));
  }
  struct alignas(16) Chunk { unsigned char b[16]; };
  Barrier sync;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<Chunk> smem;
};

struct ThreadState {
  dim3 tid, bid, bdim, gdim;
  unsigned lane = 0, warp = 0;
  unsigned long long shuffles = 0;  // picks the slot bank; in step across a warp's lanes
  Block* block = nullptr;
};

inline thread_local ThreadState tls;

inline Warp& my_warp() { return *tls.block->warps[tls.warp]; }
inline void* dynamic_smem() { return static_cast<void*>(tls.block->smem.data()); }

inline void check_mask(unsigned mask) {
  const int n = my_warp().size;
  const unsigned full = n == kWarpSize ? 0xffffffffu : ((1u << n) - 1u);
  if ((mask & full) != full) fail("only full-warp masks are emulated");
}

// Every lane of the warp publishes `var`, then reads lane `src`'s value (its own when src is out of range).
template <typename T>
T exchange(T var, int src) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>, "shuffle of an unsupported type");
  Warp& w = my_warp();
  auto& bank = w.slots[tls.shuffles++ & 1];
  std::memcpy(bank[tls.lane], &var, sizeof(T));
  w.bar.arrive_and_wait();
  T out = var;
  if (src >= 0 && src < w.size) std::memcpy(&out, bank[src], sizeof(T));
  return out;
}

// First lane of the `width`-wide segment of the warp that this lane belongs to.
inline int seg_start(int width) { return int(tls.lane) & ~(width - 1); }

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::tls.tid)
#define blockIdx (::cuda_emu::tls.bid)
#define blockDim (::cuda_emu::tls.bdim)
#define gridDim (::cuda_emu::tls.gdim)
#define warpSize 32
#define EXTERN_SHARED(type, name) type* name = static_cast<type*>(::cuda_emu::dynamic_smem())

// ---------------------------------------------------------------------------------------------------------
// Synchronisation and warp intrinsics.
inline void __syncthreads() { ::cuda_emu::tls.block->sync.arrive_and_wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::cuda_emu::check_mask(mask);
  ::cuda_emu::my_warp().bar.arrive_and_wait();
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  ::cuda_emu::check_mask(mask);
  return ::cuda_emu::exchange(var, ::cuda_emu::seg_start(width) + (src_lane & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  ::cuda_emu::check_mask(mask);
  const int lane = int(::cuda_emu::tls.lane), src = lane ^ lane_mask;
  return ::cuda_emu::exchange(var, src < ::cuda_emu::seg_start(width) + width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  ::cuda_emu::check_mask(mask);
  const int lane = int(::cuda_emu::tls.lane), src = lane + int(delta);
  return ::cuda_emu::exchange(var, src < ::cuda_emu::seg_start(width) + width ? src : lane);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  ::cuda_emu::check_mask(mask);
  const int lane = int(::cuda_emu::tls.lane), src = lane - int(delta);
  return ::cuda_emu::exchange(var, src >= ::cuda_emu::seg_start(width) ? src : lane);
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  ::cuda_emu::check_mask(mask);
  unsigned bits = 0;
  for (int l = 0; l < ::cuda_emu::my_warp().size; ++l) {
    // Every lane walks the same sequence of exchanges, so the barrier phases line up.
    bits |= (::cuda_emu::exchange(pred != 0 ? 1u : 0u, l) & 1u) << l;
  }
  return bits;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred == 0) == 0; }

// ---------------------------------------------------------------------------------------------------------
// Atomics on plain memory, through std::atomic_ref so concurrent lanes are race-free here too.
template <typename T>
T atomicAdd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val);
}
template <typename T>
T atomicMax(T* address, T val) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (old < val && !ref.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <typename T>
T atomicExch(T* address, T val) {
  return std::atomic_ref<T>(*address).exchange(val);
}

// ---------------------------------------------------------------------------------------------------------
// Math intrinsics. The fast-math variants are computed exactly here; the GPU's are within a few ulp.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
// Rounded on their own, as on the GPU: volatile keeps g++ from contracting a * b + c into one FMA (it may on
// targets with FMA instructions).
inline float __fmul_rn(float a, float b) {
  volatile float product = a * b;
  return product;
}
inline float __fadd_rn(float a, float b) {
  volatile float sum = a + b;
  return sum;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
template <typename T>
inline T __ldg(const T* p) { return *p; }

// ---------------------------------------------------------------------------------------------------------
// Launching a grid.
namespace cuda_emu {

// Linear index -> (x, y, z), x fastest, as CUDA numbers threads and blocks.
inline dim3 unflatten(unsigned long long i, dim3 d) {
  const unsigned long long xy = static_cast<unsigned long long>(d.x) * d.y;
  return dim3(unsigned(i % d.x), unsigned((i / d.x) % d.y), unsigned(i / xy));
}

#if CUDA_EMU_THREADS

// Runs `kernel(args...)` over `grid` x `block`; returns when every block has finished.
template <typename... Params, typename... Args>
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, void (*kernel)(Params...), Args... args) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned long long blocks = static_cast<unsigned long long>(grid.x) * grid.y * grid.z;
  if (threads == 0 || threads > 1024) fail("block must have 1..1024 threads");
  if (blocks == 0) return;
  std::unique_ptr<Block> current = std::make_unique<Block>(threads, smem_bytes);
  // Runs once per block, after every thread finished it and before any starts the next one.
  auto renew = [&]() noexcept { current = std::make_unique<Block>(threads, smem_bytes); };
  std::barrier done(std::ptrdiff_t(threads), renew);
  auto body = [&](unsigned t) {
    tls.tid = unflatten(t, block);
    tls.bdim = block;
    tls.gdim = grid;
    tls.lane = t % kWarpSize;
    tls.warp = t / kWarpSize;
    for (unsigned long long b = 0; b < blocks; ++b) {
      tls.bid = unflatten(b, grid);
      tls.block = current.get();
      tls.shuffles = 0;
      kernel(args...);
      // Like an exited GPU thread, a finished one stops counting towards later barriers of this block.
      tls.block->sync.arrive_and_drop();
      my_warp().bar.arrive_and_drop();
      done.arrive_and_wait();
    }
    tls.block = nullptr;
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (std::thread& th : pool) th.join();
}

#else

// One CUDA thread of the block being run: its context and its values of `tls` while it is switched out.
struct Fiber {
  ucontext_t context;
  ThreadState state;
  bool finished = false;
};

// The launch running on this host thread: the context its fibers yield to, the fiber running now, and the
// lane body they all run.
struct Scheduler {
  ucontext_t main;
  Fiber* current = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  unsigned long long progress = 0;  // arrivals and exits: a round of the fibers without any is a deadlock
};

inline thread_local Scheduler scheduler;

inline void fiber_progress() { ++scheduler.progress; }
inline void fiber_wait() { swapcontext(&scheduler.current->context, &scheduler.main); }

// A fiber's first frame; returning switches to uc_link, the scheduler.
inline void fiber_entry() {
  scheduler.body(scheduler.arg);
  scheduler.current->finished = true;
  fiber_progress();
}

// One stack per fiber, each above a guard page, so an overflow faults instead of overwriting a neighbour.
class Stacks {
 public:
  static constexpr std::size_t kBytes = 256 * 1024;
  static constexpr std::size_t kGuard = 4096;

  explicit Stacks(unsigned count) : size_(count * (kBytes + kGuard)) {
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("no memory for the fibers' stacks");
    base_ = static_cast<unsigned char*>(p);
    for (unsigned i = 0; i < count; ++i) {
      if (mprotect(base_ + i * (kBytes + kGuard), kGuard, PROT_NONE) != 0) fail("mprotect of a guard page");
    }
  }
  ~Stacks() { munmap(base_, size_); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;

  void* stack(unsigned i) const { return base_ + i * (kBytes + kGuard) + kGuard; }

 private:
  std::size_t size_;
  unsigned char* base_ = nullptr;
};

// Points the fiber at fiber_entry on its stack. Not inlined: getcontext returns twice as far as the compiler
// knows (it never does here), which would have it warn about every local of the caller.
__attribute__((noinline)) inline void start_fiber(Fiber& f, void* stack) {
  if (getcontext(&f.context) != 0) fail("getcontext");
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = Stacks::kBytes;
  f.context.uc_stack.ss_flags = 0;
  f.context.uc_link = &scheduler.main;
  makecontext(&f.context, fiber_entry, 0);
}

// Runs the block's fibers in turn, each up to its next wait, until every one has returned.
inline void run_fibers(std::vector<Fiber>& fibers) {
  for (std::size_t live = fibers.size(); live > 0;) {
    const unsigned long long before = scheduler.progress;
    live = 0;
    for (Fiber& f : fibers) {
      if (f.finished) continue;
      scheduler.current = &f;
      tls = f.state;
      swapcontext(&scheduler.main, &f.context);
      f.state = tls;
      live += !f.finished;
    }
    if (live > 0 && scheduler.progress == before) fail("deadlock: some thread of the block never reaches a barrier");
  }
  scheduler.current = nullptr;
}

// Runs `kernel(args...)` over `grid` x `block`; returns when every block has finished.
template <typename... Params, typename... Args>
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, void (*kernel)(Params...), Args... args) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned long long blocks = static_cast<unsigned long long>(grid.x) * grid.y * grid.z;
  if (threads == 0 || threads > 1024) fail("block must have 1..1024 threads");
  if (scheduler.current != nullptr) fail("a kernel launched from a kernel");
  if (blocks == 0) return;
  auto body = [&]() {
    kernel(args...);
    // Like an exited GPU thread, a finished one stops counting towards later barriers of this block.
    tls.block->sync.arrive_and_drop();
    my_warp().bar.arrive_and_drop();
  };
  scheduler.body = [](void* lane_body) { (*static_cast<decltype(body)*>(lane_body))(); };
  scheduler.arg = &body;
  const Stacks stacks(threads);
  std::vector<Fiber> fibers(threads);
  for (unsigned long long b = 0; b < blocks; ++b) {
    Block current(threads, smem_bytes);
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = fibers[t];
      f.finished = false;
      f.state = ThreadState{.tid = unflatten(t, block), .bid = unflatten(b, grid), .bdim = block, .gdim = grid,
                            .lane = t % kWarpSize, .warp = t / kWarpSize, .shuffles = 0, .block = &current};
      start_fiber(f, stacks.stack(t));
    }
    run_fibers(fibers);
  }
  tls = ThreadState{};
}

#endif

}  // namespace cuda_emu

// nvcuda::wmma, for the tensor-core kernels.
#include <cstdint>
#include "cuda_emu_wmma.h"
