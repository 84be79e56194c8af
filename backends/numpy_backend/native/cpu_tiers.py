"""The CPU tiers the C kernels are built for, and which of them this CPU can run.

The kernels choose their SIMD paths at compile time (`#if defined(__AVX2__)` and so on), so a tier is one build
of the same source with the compiler flags of its instruction set. The tier is picked at start-up from the
features the CPU reports (the highest it can run) or forced by `backend.cpu_isa`, and a forced tier the CPU
cannot run is refused before anything is built. The tests build every tier the host can run, so a machine
with AMX also proves the AVX-512, AVX2 and generic paths.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
X86, ARM = "x86_64", "aarch64"
# x86-64-v2 and v3 as the psABI defines them, in the names Linux gives the CPU's flags (abm is lzcnt)
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_VNNI = _V4 | {"avx512_vnni"}
_AMX = _VNNI | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
_NEON = frozenset({"asimd", "asimddp", "fphp", "asimdhp"})  # Advanced SIMD, int8 dot products, float16


class CpuTierError(ValueError):
    """A tier that does not exist, or that this CPU cannot run."""


@dataclass(frozen=True)
class CpuTier:
    name: str
    machine: str  # X86 or ARM
    arch_flags: tuple[str, ...]  # the compiler's target, in place of -march=native
    needs: frozenset[str]  # the CPU features its instructions use, as /proc/cpuinfo names them
    summary: str  # what it adds, for the start-up log

    def runs_on(self, machine: str, features: frozenset[str]) -> bool:
        return machine == self.machine and self.needs <= features


# Lowest first: `auto` takes the last one the CPU can run.
TIERS: tuple[CpuTier, ...] = (
    # -Wno-psabi: GCC notes that 8-float vectors pass differently without AVX, which no caller outside sees
    CpuTier("generic", X86, ("-march=x86-64", "-Wno-psabi"), frozenset(), "SSE2, the kernels' plain C paths"),
    CpuTier("avx2", X86, ("-march=x86-64-v3",), _V3, "AVX2, FMA and F16C"),
    CpuTier("avx512", X86, ("-march=x86-64-v4",), _V4, "AVX-512 (F, BW, CD, DQ, VL)"),
    CpuTier("avx512-vnni", X86, ("-march=x86-64-v4", "-mavx512vnni"), _VNNI, "AVX-512 with VNNI"),
    CpuTier("amx", X86, ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-bf16",
                         "-mamx-int8"), _AMX, "AVX-512 VNNI and BF16, AMX tiles"),
    CpuTier("generic", ARM, ("-march=armv8-a",), frozenset({"asimd"}),  # every ARMv8-A CPU has Advanced SIMD
            "NEON without the int8 dot products"),
    CpuTier("neon", ARM, ("-march=armv8.2-a+dotprod+fp16",), _NEON, "NEON with int8 dot products and float16"),
)
NAMES = tuple(dict.fromkeys(tier.name for tier in TIERS))
CHOICES = (AUTO, *NAMES)


@dataclass(frozen=True)
class CpuInfo:
    """The machine and the features its CPU reports."""

    machine: str
    features: frozenset[str]

    @classmethod
    def of_this_host(cls) -> CpuInfo:
        machine = _machine_name(platform.machine())
        return cls(machine, frozenset(_linux_features() or _darwin_features()))

    def runnable(self) -> tuple[CpuTier, ...]:
        """Every tier this CPU can run, lowest first."""
        return tuple(tier for tier in TIERS if tier.runs_on(self.machine, self.features))

    def choose(self, wanted: str = AUTO) -> CpuTier:
        """The tier `wanted` names, or the highest this CPU runs for AUTO; CpuTierError when it cannot run it."""
        runnable = self.runnable()
        if wanted == AUTO:
            if not runnable:
                raise CpuTierError(f"the C kernels have no build for a {self.machine} CPU")
            return runnable[-1]
        return self._forced(wanted, runnable)

    def _forced(self, wanted: str, runnable: tuple[CpuTier, ...]) -> CpuTier:
        if wanted not in NAMES:
            raise CpuTierError(f"cpu_isa must be one of {', '.join(CHOICES)}, not {wanted!r}")
        for tier in runnable:
            if tier.name == wanted:
                return tier
        raise _refusal(wanted, self, describe(runnable) or "none")


def host_tier() -> CpuTier:
    """The highest tier this CPU runs (what `auto` picks)."""
    return CpuInfo.of_this_host().choose()


def find(name: str, machine: str) -> CpuTier:
    """The tier `name` for `machine` (the tests build tiers for another machine: aarch64 on x86)."""
    for tier in TIERS:
        if tier.name == name and tier.machine == machine:
            return tier
    raise CpuTierError(f"no tier {name!r} for {machine}")


def _refusal(wanted: str, cpu: CpuInfo, can: str) -> CpuTierError:
    tiers = [tier for tier in TIERS if tier.name == wanted]
    own = [tier for tier in tiers if tier.machine == cpu.machine]
    if not own:
        return CpuTierError(f"cpu_isa {wanted} is for {tiers[0].machine} CPUs and this one is {cpu.machine} "
                            f"(it can run: {can})")
    missing = ", ".join(sorted(own[0].needs - cpu.features))
    return CpuTierError(f"cpu_isa {wanted} needs CPU features this one lacks ({missing}); it can run: {can}")


def _machine_name(reported: str) -> str:
    return {"amd64": X86, "x86_64": X86, "arm64": ARM, "aarch64": ARM}.get(reported.lower(), reported.lower())


def _linux_features() -> set[str]:
    """The first CPU's flags (x86) or Features (aarch64) line of /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


# macOS has no /proc/cpuinfo; its sysctl names the Arm features (every Apple CPU has NEON and float16)
_DARWIN_FEATURES = {"hw.optional.arm.FEAT_DotProd": ("asimddp",), "hw.optional.arm.FEAT_FP16": ("fphp", "asimdhp"),
                    "hw.optional.AdvSIMD": ("asimd",)}


def _darwin_features() -> set[str]:
    if platform.system() != "Darwin":
        return set()
    return {feature for key, names in _DARWIN_FEATURES.items() if _sysctl_flag(key) for feature in names}


def _sysctl_flag(key: str) -> bool:
    try:
        done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.stdout.strip() == "1"


def describe(tiers: Iterable[CpuTier]) -> str:
    return ", ".join(tier.name for tier in tiers)
