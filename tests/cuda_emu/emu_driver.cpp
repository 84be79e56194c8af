// Shared library that runs the kernels' exact source on the CPU. The build (tests/cuda/toolchain.py) generates
// two includes: emu_sources.inc (#include of every kernels/*.cu) and emu_registry.inc (one EMU_KERNEL(name)
// per exported kernel name listed in launch.py, so a name missing from the sources fails the build).
// probe_kernels.cu adds kernels that test the emulation itself.
// emu_launch mirrors cuLaunchKernel: a name, grid, block, dynamic shared memory bytes and an array of pointers to
// the arguments, plus the argument type string from launch.py, checked against the kernel's real parameters.
#include "cuda_emu.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "emu_sources.inc"
#include "probe_kernels.cu"

namespace {

template <typename P>
constexpr char type_code() {
  using T = std::remove_cv_t<P>;
  if constexpr (std::is_pointer_v<T>) return 'p';
  else if constexpr (std::is_same_v<T, int>) return 'i';
  else if constexpr (std::is_same_v<T, long long>) return 'q';
  else if constexpr (std::is_same_v<T, float>) return 'f';
  else return '?';
}

template <typename... Params>
std::string signature(void (*)(Params...)) {
  return std::string{type_code<Params>()...};
}

template <typename... Params, std::size_t... I>
void launch_unpacked(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, void** args,
                     std::index_sequence<I...>) {
  cuda_emu::launch(grid, block, smem, kernel, *static_cast<std::remove_cv_t<Params>*>(args[I])...);
}

template <auto Kernel>
void launch_packed(dim3 grid, dim3 block, std::size_t smem, void** args) {
  [&]<typename... Params>(void (*k)(Params...)) {
    launch_unpacked(k, grid, block, smem, args, std::index_sequence_for<Params...>{});
  }(Kernel);
}

struct Entry {
  const char* name;
  std::string (*sig)();
  void (*launch)(dim3, dim3, std::size_t, void**);
};

template <auto Kernel>
std::string signature_of() {
  return signature(Kernel);
}

#define EMU_KERNEL(fn) Entry{#fn, &signature_of<&fn>, &launch_packed<&fn>}
const Entry kKernels[] = {
#include "emu_registry.inc"
    EMU_KERNEL(emu_probe_warp),
    EMU_KERNEL(emu_probe_race),
};
#undef EMU_KERNEL

}  // namespace

extern "C" {

// 0 on success; 1 unknown kernel; 2 argument types differ from the kernel's parameters.
int emu_launch(const char* name, const char* arg_types, const unsigned* grid, const unsigned* block,
               unsigned long long shared_mem, void** args) {
  for (const Entry& e : kKernels) {
    if (std::strcmp(e.name, name) != 0) continue;
    const std::string want = e.sig();
    if (want != arg_types) {
      std::fprintf(stderr, "emu_launch %s: kernel takes '%s', got '%s'\n", name, want.c_str(), arg_types);
      return 2;
    }
    e.launch(dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]), shared_mem, args);
    return 0;
  }
  std::fprintf(stderr, "emu_launch: no kernel named %s\n", name);
  return 1;
}

// The emulated conversions, exposed so tests can compare them with NumPy's rounding.
void emu_f32_to_f16(const float* in, std::uint16_t* out, long long n) {
  for (long long i = 0; i < n; ++i) out[i] = __float2half_rn(in[i]).bits;
}
void emu_f16_to_f32(const std::uint16_t* in, float* out, long long n) {
  for (long long i = 0; i < n; ++i) out[i] = __half2float(__half{in[i]});
}
void emu_f32_to_bf16(const float* in, std::uint16_t* out, long long n) {
  for (long long i = 0; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]).bits;
}
void emu_bf16_to_f32(const std::uint16_t* in, float* out, long long n) {
  for (long long i = 0; i < n; ++i) out[i] = __bfloat162float(__nv_bfloat16{in[i]});
}

}  // extern "C"
