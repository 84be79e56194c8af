"""The C compiler the NumPy backend's native kernels are built with, for the tests of those kernels: missing, it
fails the test under CI=true and skips it elsewhere (the backend then runs its NumPy code, tested on its own)."""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backends.numpy_backend.native.build import FLAGS, SOURCE_DIR, default_cache_dir, tier_flags
from backends.numpy_backend.native.cpu_tiers import TIERS, CpuTier
from tests import required
from tests.backends.tiers import HOST

KERNEL_CHECKS = "the NumPy backend's C kernel tests"


def require_c_compiler() -> str:
    """The path of what backends.numpy_backend.native.build runs ($CC, else cc)."""
    command = os.environ.get("CC", "cc")
    words = shlex.split(command)
    found = shutil.which(words[0]) if words else None
    if found is None:
        required.unavailable(f"no C compiler: {command!r} not found on PATH", KERNEL_CHECKS)
    return found


def require_gcc() -> str:
    found = shutil.which("gcc")
    if found is None:
        required.unavailable("no gcc on PATH", KERNEL_CHECKS)
    return found


# Every tier of this machine's architecture, for the tests that only compile (the CPU need not run them all).
OWN_TIERS = tuple(tier for tier in TIERS if tier.machine == HOST.machine)


def flags_for(tier: CpuTier) -> list[str]:
    """The kernels' build flags for `tier`, as backends.numpy_backend.native.build gives them."""
    return [*FLAGS, *tier_flags(tier)]


@dataclass(frozen=True)
class CheckedCompile:
    """A compile a test requires to pass (-Werror, say): running (`proc`), or passed before on the same inputs
    (`proc` None; `output` is that build's, in the cache, and `log` what the compiler printed)."""

    output: Path
    proc: subprocess.Popen[str] | None = None
    log: str = ""
    cache_as: Path | None = None  # where a successful build is kept

    def wait(self) -> tuple[int, str]:
        """The compiler's exit status and what it printed; a successful build is kept in the cache."""
        if self.proc is None:
            return 0, self.log
        _, log = self.proc.communicate(timeout=600)
        if self.proc.returncode == 0 and self.cache_as is not None:
            _store(self.output, log, self.cache_as)
        return self.proc.returncode, log


def start_checked_compile(cc: str, args: list[str], sources: list[Path], output: Path) -> CheckedCompile:
    """`cc ARGS -o OUTPUT SOURCES -lm`, started; or, when a build of the same sources, arguments, compiler (its
    --version), CPU and kernel sources and headers (all the sources include but the system's headers) passed
    before, that build from the cache: a compiler gives the same warnings for the same inputs, and each tier's
    compile takes 10-60 s of the suite. A failed build is never cached."""
    key = _compile_key(cc, args, sources)
    cached = checked_cache_dir() / f"{sources[0].stem}-{key}{output.suffix}"
    if cached.exists() and _log_of(cached).exists():
        return CheckedCompile(cached, log=_log_of(cached).read_text())
    command = [cc, *args, "-o", str(output), *map(str, sources), "-lm"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return CheckedCompile(output, proc, cache_as=cached)


def checked_cache_dir() -> Path:
    """Beside the kernels' own builds (build.py), which are cached by the same kind of key."""
    return default_cache_dir() / "checked"


def _compile_key(cc: str, args: list[str], sources: list[Path]) -> str:
    digest = hashlib.sha256(_version(cc).encode() + b"\0" + "\0".join(args).encode())
    for path in (*sources, *sorted(SOURCE_DIR.glob("*.[ch]"))):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(_cpu().encode())  # -mtune=native
    return digest.hexdigest()[:16]


@functools.cache
def _version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout


def _cpu() -> str:
    """The first CPU's model and features: what -mtune=native tunes for."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(("model name", "flags", "Features"))))


def _log_of(build: Path) -> Path:
    return build.with_name(build.name + ".log")


def _store(build: Path, log: str, target: Path) -> None:
    """Copies a successful build into the cache, its log first: a build without its log is not used, and a
    concurrent run sees whole files only (each written to a temporary name, then renamed)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for path, data in ((_log_of(target), log.encode()), (target, build.read_bytes())):
            fd, tmp = tempfile.mkstemp(dir=target.parent)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
    except OSError:  # an unwritable cache: the build passed, it is only not kept
        return
