"""The NumPy backend's C kernels cross-built for AArch64 and run under qemu-user, for
tests/backends/test_aarch64_kernels.py.

Python cannot load an AArch64 library, so driver.c (built for AArch64 too) loads it and makes the calls: a `Batch`
writes each call's arrays to files, runs the driver once under the emulator for all its calls, and reads back
their outputs, which the tests compare with the x86 kernel tests' NumPy references. Missing tools fail the tests
under CI=true (tests/required.py) and skip them elsewhere; `make cross-tools` installs them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.model.quant import Matrix, QuantMatrix
from backends.numpy_backend.native.build import OPENMP, SOURCE_DIR, default_cache_dir
from backends.numpy_backend.native.cpu_tiers import ARM, TIERS, CpuTier
from tests import required
from tests.backends.compiler import flags_for
from tests.background import niced

CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's AArch64 libraries, where the emulator finds the loader
CHECKS = "the AArch64 kernel tests (`make cross-tools` installs their compiler and emulator)"
DRIVER = Path(__file__).parent / "driver.c"
HALF_CHECK = Path(__file__).parent.parent / "half_check.c"  # half.h's conversions, exported
LIBRARIES = {"matmul": SOURCE_DIR / "matmul_rows.c", "attention": SOURCE_DIR / "paged_attention.c",
             "half": HALF_CHECK, "sampling": SOURCE_DIR / "sampling.c"}  # each tier's
ARM_TIERS: dict[str, CpuTier] = {tier.name: tier for tier in TIERS if tier.machine == ARM}  # cpu_tiers.py's
WARNINGS = ("-Wall", "-Wextra", "-Werror")
OUT = object()  # in a call's words: its output file
DONE = "complete"  # the file a finished build directory holds


@dataclass(frozen=True)
class Tools:
    cc: str
    qemu: str


def require_tools() -> Tools:
    """The cross compiler and the emulator, or a failure (CI) or skip (elsewhere) naming what is missing."""
    tools = find_tools()
    if tools is None:
        missing = [name for name in (CROSS_CC, QEMU) if shutil.which(name) is None]
        required.unavailable(f"{' and '.join(missing)} not on PATH", CHECKS)
    return tools


def find_tools() -> Tools | None:
    cc, qemu = shutil.which(CROSS_CC), shutil.which(QEMU)
    return None if cc is None or qemu is None else Tools(cc, qemu)


@dataclass(frozen=True)
class Build:
    """One tier's libraries: the projections (matmul_rows.c), attention (paged_attention.c), half.h's
    conversions (half_check.c) and the sampler (sampling.c), built with the kernels' flags and the tier's target
    in place of -march=native."""

    tier: str
    matmul: Path
    attention: Path
    half: Path
    sampling: Path


def start_compile(cc: str, flags: tuple[str, ...], sources: list[Path], target: Path) -> subprocess.Popen[str]:
    cmd = [cc, *flags, *WARNINGS, f"-I{SOURCE_DIR}", "-o", str(target), *map(str, sources), "-lm"]
    return subprocess.Popen(niced(cmd),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@dataclass(frozen=True)
class Kernels:
    """Every tier's build, and the driver that runs them."""

    tools: Tools
    builds: dict[str, Build]
    driver: Path

    def batch(self, directory: Path) -> Batch:
        return Batch(self.tools, self.driver, directory)


def build_all(tools: Tools) -> Kernels:
    """The driver and every tier's libraries, from the cache when built before (the attention kernels alone take
    the cross compiler about 8 s of CPU a tier): keyed by a hash of everything the builds read, under the kernels'
    cache directory; else in a new directory there (or, unwritable, a temporary one), renamed into place."""
    directory = default_cache_dir() / f"aarch64-tests-{build_key(tools.cc)}"
    if not (directory / DONE).exists():
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            fresh = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".aarch64-"))
        except OSError:
            fresh = directory = Path(tempfile.mkdtemp(prefix="aarch64-tests-"))
        try:
            compile_all(tools, fresh)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        (fresh / DONE).touch()
        if fresh != directory:
            try:
                fresh.rename(directory)
            except OSError:  # another run got there first: its builds are the same
                shutil.rmtree(fresh)
    builds = {tier: Build(tier, *(directory / f"{name}-{tier}.so" for name in LIBRARIES)) for tier in ARM_TIERS}
    return Kernels(tools, builds, directory / "driver")


def build_key(cc: str) -> str:
    """A hash of the kernels' sources and headers, the driver and half_check.c, the flags and the compiler."""
    digest = hashlib.sha256(repr([(name, flags_for(tier)) for name, tier in ARM_TIERS.items()]).encode())
    for path in (*sorted(SOURCE_DIR.glob("*.[ch]")), DRIVER, HALF_CHECK):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join((*OPENMP, *WARNINGS)).encode())
    digest.update(subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.encode())
    return digest.hexdigest()[:16]


def compile_all(tools: Tools, directory: Path) -> None:
    """Every library and the driver into `directory`, compiled side by side."""
    jobs: dict[Path, subprocess.Popen[str]] = {}
    for tier_name, tier in ARM_TIERS.items():
        flags = (*flags_for(tier), *OPENMP)  # as build.py builds the tier: its target, no -mtune=native here
        for name, source in LIBRARIES.items():
            target = directory / f"{name}-{tier_name}.so"
            jobs[target] = start_compile(tools.cc, flags, [source], target)
    driver = directory / "driver"
    jobs[driver] = start_compile(tools.cc, ("-O2", "-std=gnu11"), [DRIVER], driver)
    errors = {target: job.communicate(timeout=600)[1] for target, job in jobs.items()}  # waits for every one
    failed = {target.name: text for target, text in errors.items() if jobs[target].returncode != 0}
    assert not failed, failed


@dataclass
class Call:
    """One kernel call: its return value and output once the batch has run."""

    out: Path
    shape: tuple[int, ...]
    dtype: type
    status: int | None = None

    def result(self) -> np.ndarray:
        assert self.status == 0, f"the kernel returned {self.status}"
        return np.fromfile(self.out, self.dtype).reshape(self.shape)


@dataclass
class Batch:
    """Kernel calls queued for one run of the driver under the emulator."""

    tools: Tools
    driver: Path
    directory: Path
    lines: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    inputs: int = 0

    def _file(self, array: np.ndarray) -> str:
        self.inputs += 1
        path = self.directory / f"in{self.inputs}"
        np.ascontiguousarray(array).tofile(path)
        return str(path)

    def _queue(self, words: list[object], shape: tuple[int, ...], dtype: type) -> Call:
        call = Call(self.directory / f"out{len(self.calls)}", shape, dtype)
        self.lines.append(" ".join(str(call.out if word is OUT else word) for word in words))
        self.calls.append(call)
        return call

    def matmul(self, build: Build, x: np.ndarray, w: Matrix, fast: bool = False) -> Call:
        """x @ w.T by matmul_weights_f32, w float32 or as stored."""
        data, row_bytes, qtype = weights_of(w)
        rows, inner = x.shape
        return self._queue(["matmul", build.matmul, self._file(x.astype(np.float32)), self._file(data), OUT,
                            row_bytes, qtype, rows, inner, w.shape[0], int(fast)], (rows, w.shape[0]), np.float32)

    def dequantize(self, build: Build, w: QuantMatrix) -> Call:
        return self._queue(["dequantize", build.matmul, self._file(w.data), OUT, w.row_bytes, int(w.qtype),
                            *w.shape], w.shape, np.float32)

    def probe(self, build: Build) -> Call:
        """fast_small_steps, fast_uses_tiles, quant_sums_wide and built_with_openmp of the build."""
        return self._queue(["probe", build.matmul, OUT], (4,), np.int32)

    def decode(self, build: Build, q: np.ndarray, k: np.ndarray, v: np.ndarray, tables: np.ndarray,
               lens: np.ndarray, parallel_min_tokens: int, window: int = 0) -> Call:
        """decode_attention_f32 over a float32 or float16 cache, as kernels.NativeAttention.decode calls it."""
        batch, heads, dim = q.shape
        num_blocks, block_size, kv_heads, _ = k.shape
        return self._queue(["decode", build.attention, *map(self._file, (q, k, v)), self._file(tables.astype(np.int32)),
                            self._file(lens.astype(np.int32)), OUT, heads, kv_heads, dim, block_size,
                            tables.shape[1], float(np.float32(dim**-0.5)).hex(), batch, parallel_min_tokens,
                            int(k.dtype == np.float16), window, num_blocks], q.shape, np.float32)

    def chunk(self, build: Build, q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray, context: int,
              parallel_min_pairs: int, window: int = 0) -> Call:
        """chunk_attention_f32, as kernels.NativeAttention.chunk calls it."""
        n, heads, dim = q.shape
        num_blocks, block_size, kv_heads, _ = k.shape
        return self._queue(["chunk", build.attention, *map(self._file, (q, k, v)), self._file(table.astype(np.int32)),
                            OUT, len(table), num_blocks, context, n, heads, kv_heads, dim, block_size,
                            float(np.float32(dim**-0.5)).hex(), parallel_min_pairs, int(k.dtype == np.float16),
                            window],
                           q.shape, np.float32)

    def sample(self, build: Build, logits: np.ndarray, temperature: np.ndarray, min_p: np.ndarray,
               top_k: np.ndarray, top_p: np.ndarray, uniforms: np.ndarray) -> Call:
        """sample_rows_f32, as sampler.NativeSampler calls it: one token id per row."""
        rows, vocab = logits.shape
        arrays: list[np.ndarray] = [logits.astype(np.float32), temperature.astype(np.float32),
                                    min_p.astype(np.float32), top_k.astype(np.int64), top_p.astype(np.float32),
                                    uniforms.astype(np.float64)]
        return self._queue(["sample", build.sampling, *map(self._file, arrays), OUT, rows, vocab], (rows,), np.int64)

    def logprobs(self, build: Build, logits: np.ndarray, tokens: np.ndarray, k: int) -> Call:
        """row_logprobs_f32: its three outputs in one file, as bytes (split_logprobs reads them)."""
        rows, vocab = logits.shape
        return self._queue(["logprobs", build.sampling, self._file(logits.astype(np.float32)),
                            self._file(tokens.astype(np.int64)), OUT, rows, vocab, k], (rows * (4 + 12 * k),),
                           np.uint8)

    def round_to_half(self, build: Build, x: np.ndarray) -> Call:
        return self._queue(["round_to_half", build.half, self._file(x.astype(np.float32)), OUT, len(x)], x.shape,
                           np.float16)

    def widen_half(self, build: Build, h: np.ndarray) -> Call:
        return self._queue(["widen_half", build.half, self._file(h.astype(np.float16)), OUT, len(h)], h.shape,
                           np.float32)

    def run(self) -> None:
        """Every queued call, in one run of the driver; each call's status from its line of output."""
        # threads that wait at a barrier sleep: spinning, emulated, took a third of the run's time
        env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        cmd = niced([self.tools.qemu, "-L", str(SYSROOT), str(self.driver)])
        done = subprocess.run(cmd, input="\n".join(self.lines), capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr
        statuses = done.stdout.split()
        assert len(statuses) == len(self.calls), done.stdout
        for call, status in zip(self.calls, statuses, strict=True):
            call.status = int(status)


def weights_of(w: Matrix) -> tuple[np.ndarray, int, int]:
    """The stored bytes, bytes of a row and ggml type id of a weight matrix (weights.c_weights' descriptor)."""
    if isinstance(w, QuantMatrix):
        return w.data, w.row_bytes, int(w.qtype)
    return np.ascontiguousarray(w, np.float32), 4 * w.shape[1], 0


def split_logprobs(data: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A logprobs call's bytes: the chosen tokens' (rows,), the top ids and their values (rows, k)."""
    chosen = data[:4 * rows].view(np.float32)
    ids = data[4 * rows:4 * rows + 8 * rows * k].view(np.int64).reshape(rows, k)
    return chosen, ids, data[4 * rows + 8 * rows * k:].view(np.float32).reshape(rows, k)
