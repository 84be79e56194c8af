"""The CPU tiers (cpu_tiers.py): which one each kind of CPU gets, what a forced one the CPU cannot run says, that
each tier's compiler flags enable only the instructions its CPU features cover, and the backend's choice."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.config import CPU_ISAS, BackendConfig
from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.build import FLAGS
from backends.numpy_backend.native.cpu_tiers import ARM, AUTO, TIERS, X86, CpuInfo, CpuTier, CpuTierError, find
from tests.backends.compiler import OWN_TIERS
from tests.backends.tiers import HOST, RUNNABLE
from tests.backends.tiny_gguf import write_tiny_llama

# /proc/cpuinfo's flags of real CPUs, cut to the ones the tiers look at (and a few they must ignore)
HASWELL = "sse2 ssse3 sse4_1 sse4_2 popcnt cx16 lahf_lm avx avx2 fma f16c bmi1 bmi2 abm movbe xsave aes"
SKYLAKE_X = HASWELL + " avx512f avx512bw avx512cd avx512dq avx512vl"
ICE_LAKE = SKYLAKE_X + " avx512_vnni avx512vbmi avx512_vbmi2 gfni vaes"
ZEN4 = ICE_LAKE + " avx512_bf16"  # VNNI and BF16, no AMX
SAPPHIRE_RAPIDS = ZEN4 + " amx_tile amx_bf16 amx_int8 avx512_fp16"
NEHALEM = "sse2 ssse3 sse4_1 sse4_2 popcnt cx16 lahf_lm"  # no AVX at all
NEOVERSE_N1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
CORTEX_A72 = "fp asimd evtstrm crc32 cpuid"  # a Raspberry Pi 4: no dot products, no float16 arithmetic


@pytest.mark.parametrize(("machine", "flags", "tier"), [
    (X86, NEHALEM, "generic"), (X86, HASWELL, "avx2"), (X86, SKYLAKE_X, "avx512"), (X86, ICE_LAKE, "avx512-vnni"),
    (X86, ZEN4, "avx512-vnni"), (X86, SAPPHIRE_RAPIDS, "amx"), (ARM, CORTEX_A72, "generic"),
    (ARM, NEOVERSE_N1, "neon")])
def test_auto_picks_the_highest_tier_the_cpu_runs(machine: str, flags: str, tier: str) -> None:
    cpu = CpuInfo(machine, frozenset(flags.split()))
    chosen = cpu.choose(AUTO)
    assert (chosen.name, chosen.machine) == (tier, machine)
    assert cpu.runnable()[-1] == chosen and all(t.machine == machine for t in cpu.runnable())


def test_a_forced_tier_is_refused_naming_what_the_cpu_lacks() -> None:
    haswell = CpuInfo(X86, frozenset(HASWELL.split()))
    assert haswell.choose("generic").name == "generic" and haswell.choose("avx2").name == "avx2"
    with pytest.raises(CpuTierError, match=r"^cpu_isa avx512-vnni needs CPU features this one lacks "
                       r"\(avx512_vnni, avx512bw, avx512cd, avx512dq, avx512f, avx512vl\); it can run: generic, avx2$"):
        haswell.choose("avx512-vnni")
    with pytest.raises(CpuTierError, match=r"^cpu_isa neon is for aarch64 CPUs and this one is x86_64 \(it can run"):
        haswell.choose("neon")
    with pytest.raises(CpuTierError, match="cpu_isa must be one of auto, generic, avx2, .*, not 'sse9'"):
        haswell.choose("sse9")
    with pytest.raises(CpuTierError, match="no build for a riscv64 CPU"):
        CpuInfo("riscv64", frozenset()).choose(AUTO)


def test_each_tier_needs_what_the_tiers_below_it_need() -> None:
    """So `auto`, taking the highest, never lands on a tier that lacks a lower one's instructions."""
    for machine in (X86, ARM):
        tiers = [tier for tier in TIERS if tier.machine == machine]
        assert all(low.needs <= high.needs for low, high in zip(tiers, tiers[1:], strict=False))
    assert CPU_ISAS == (AUTO, *dict.fromkeys(tier.name for tier in TIERS))


# The compiler's feature macros and the /proc/cpuinfo flag each stands for.
X86_MACROS = {"__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2", "__POPCNT__": "popcnt",
              "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c", "__BMI__": "bmi1",
              "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe", "__XSAVE__": "xsave",
              "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512CD__": "avx512cd",
              "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni",
              "__AVX512BF16__": "avx512_bf16", "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16",
              "__AMX_INT8__": "amx_int8", "__AVX512FP16__": "avx512_fp16", "__AVXVNNI__": "avx_vnni",
              "__AVX512VBMI__": "avx512vbmi", "__GFNI__": "gfni", "__VAES__": "vaes"}


ARM_MACROS = {"__ARM_NEON": "asimd", "__ARM_FEATURE_DOTPROD": "asimddp",
              "__ARM_FEATURE_FP16_SCALAR_ARITHMETIC": "fphp", "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
              "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_MATMUL_INT8": "i8mm"}


@pytest.mark.parametrize("tier", OWN_TIERS, ids=lambda t: t.name)
def test_a_tiers_flags_enable_exactly_the_instructions_it_needs(c_compiler: str, tier: CpuTier) -> None:
    """The compiler's feature macros for the tier's flags: each one it defines is a feature the tier requires of
    the CPU, and each required one is defined (the kernels' #ifs read these macros)."""
    macros = X86_MACROS if tier.machine == X86 else ARM_MACROS
    done = subprocess.run([c_compiler, *FLAGS, *tier.arch_flags, "-dM", "-E", "-x", "c", "/dev/null"],
                          capture_output=True, text=True, check=True)
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    enabled = {flag for macro, flag in macros.items() if macro in defined}
    assert enabled == {flag for flag in tier.needs if flag in macros.values()}


def test_find_names_a_tier_of_either_machine() -> None:
    assert find("neon", ARM).arch_flags == ("-march=armv8.2-a+dotprod+fp16",)
    assert find("generic", X86).machine == X86 and find("generic", ARM).machine == ARM
    with pytest.raises(CpuTierError):
        find("amx", ARM)
    assert OWN_TIERS == tuple(tier for tier in TIERS if tier.machine == HOST.machine)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_the_backend_builds_the_tier_it_is_given_and_says_so(tiny_path: Path, caplog: pytest.LogCaptureFixture,
                                                             c_compiler: str) -> None:
    model = load_model(tiny_path)
    lowest = RUNNABLE[0]
    with caplog.at_level(logging.INFO, "backends.numpy_backend.backend"):
        backend = NumpyBackend(model, "native", cpu_isa=lowest.name)
    assert backend.cpu_tier == lowest
    assert backend.forward.fused_step is not None and backend.forward.fused_step.tier == lowest
    runs = ", ".join(tier.name for tier in RUNNABLE)
    assert f"CPU tier {lowest.name}: {lowest.summary}, forced by cpu_isa; this CPU runs {runs}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, "backends.numpy_backend.backend"):
        assert NumpyBackend(model).cpu_tier == RUNNABLE[-1]
    assert f"CPU tier {RUNNABLE[-1].name}: {RUNNABLE[-1].summary}, the highest this CPU runs" in caplog.text
    assert NumpyBackend(model, "numpy").cpu_tier is None  # no C kernels run: no tier to report


def test_the_backend_refuses_a_tier_this_cpu_cannot_run(tiny_path: Path) -> None:
    model = load_model(tiny_path)
    own_names = {tier.name for tier in OWN_TIERS}
    foreign = next(tier for tier in TIERS if tier.name not in own_names)  # neon on x86, avx2 on ARM
    with pytest.raises(BackendError, match=f"cpu_isa {foreign.name} is for {foreign.machine} CPUs"):
        NumpyBackend(model, cpu_isa=foreign.name)
    for tier in OWN_TIERS:
        if tier not in RUNNABLE:
            with pytest.raises(BackendError, match=f"cpu_isa {tier.name} needs CPU features this one lacks"):
                NumpyBackend(model, cpu_isa=tier.name)


def test_the_setting_is_checked_and_only_for_the_numpy_backend() -> None:
    assert BackendConfig(cpu_isa="avx2").cpu_isa == "avx2"
    with pytest.raises(ValueError, match="cpu_isa must be one of"):
        BackendConfig(cpu_isa="avx3")
    with pytest.raises(ValueError, match="cpu_isa is a numpy backend setting"):
        BackendConfig(name="sim", cpu_isa="avx2")
