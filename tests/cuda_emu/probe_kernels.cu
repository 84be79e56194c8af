// Kernels that test the emulation itself, built only into the emulation library (never for the GPU).
// emu_probe_warp: every lane of a 64-thread block records the warp intrinsics' results; the test compares
// them with CUDA's documented semantics. emu_probe_race: an unsynchronised shared-memory handoff that the
// ThreadSanitizer build must report, proving the race detector sees the emulated threads.

constexpr int kProbeResults = 13;

extern "C" __global__ void emu_probe_warp(int* out) {
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  int* r = out + threadIdx.x * kProbeResults;
  r[0] = __shfl_xor_sync(full, lane, 5);
  r[1] = __shfl_xor_sync(full, lane, 1, 8);
  r[2] = __shfl_down_sync(full, lane, 3);
  r[3] = __shfl_down_sync(full, lane, 3, 8);
  r[4] = __shfl_up_sync(full, lane, 2);
  r[5] = __shfl_up_sync(full, lane, 2, 16);
  r[6] = __shfl_sync(full, lane, 7);
  r[7] = __shfl_sync(full, lane, 35, 16);
  r[8] = static_cast<int>(__ballot_sync(full, lane % 3 == 0));
  r[9] = __any_sync(full, lane == 5);
  r[10] = __all_sync(full, lane < 40) + 2 * __all_sync(full, lane < 31);
  // An 8-byte value crosses lanes whole.
  r[11] = static_cast<int>(__shfl_xor_sync(full, lane + 0.5, 3) * 2.0);
  // Dynamic shared memory is one block-wide buffer: each warp sees the other's writes after the barrier.
  EXTERN_SHARED(int, cells);
  cells[threadIdx.x] = int(threadIdx.x) * 10;
  __syncthreads();
  r[12] = cells[(threadIdx.x + 32) % blockDim.x];
}

extern "C" __global__ void emu_probe_race(int* out) {
  __shared__ int cell;
  if (threadIdx.x == 0) cell = 1;
  if (threadIdx.x == 1) out[0] = cell;  // no __syncthreads between the write and this read
}
