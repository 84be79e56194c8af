"""What a start costs is in the log at INFO, the server's default level: the model load, and each kernel compile
(the NumPy backend's C kernels, on first use; the CuPy backend's NVRTC module)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from backends.cupy_backend.launcher import compile_module
from backends.model.loader import load_model
from backends.numpy_backend.native.build import build_library
from backends.numpy_backend.native.cpu_tiers import host_tier
from backends.numpy_backend.native.weights import STORED_TYPES
from service.config.settings import ServiceConfig
from tests.backends.tiny_gguf import write_tiny_llama


def info_messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.INFO]


def test_info_is_the_default_level() -> None:
    assert ServiceConfig().log_level == "info"


def test_model_load_says_what_and_how_long(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=Q.Q8_0)
    model = load_model(path, STORED_TYPES)
    load_model(path)
    first, second = info_messages(caplog, "backends.model.loader")
    mb = f"{model.weights.num_bytes / 1e6:.0f}"
    assert re.fullmatch(rf"loaded model tiny\.gguf \({mb} MB, gguf weights\) in \d+\.\d s", first), first
    assert re.fullmatch(r"loaded model tiny\.gguf \(\d+ MB, float32 weights\) in \d+\.\d s", second), second


def test_a_kernel_compile_is_logged_once(c_compiler: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    source = tmp_path / "tiny_kernel.c"
    source.write_text("int tiny_kernel(int x) { return x + 1; }\n")
    build_library(source, host_tier(), tmp_path / "cache")
    build_library(source, host_tier(), tmp_path / "cache")  # cached: nothing compiled, nothing said
    [message] = info_messages(caplog, "backends.numpy_backend.native.build")
    pattern = rf"compiled native kernels \(tiny_kernel, tier {host_tier().name}\) in \d+\.\d s"
    assert re.fullmatch(pattern, message), message


class FakeModule:
    def __init__(self, code: str, options: tuple[str, ...]) -> None:
        self.options = options

    def get_function(self, name: str) -> Any:
        if "-bad" in self.options:
            raise RuntimeError("NVRTC error")
        return name


def test_the_cuda_compile_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    cupy = SimpleNamespace(RawModule=FakeModule)
    compile_module(cupy, "src", [("-bad",), ("-good",)], ["k1", "k2", "k3"])
    [message] = info_messages(caplog, "backends.cupy_backend.launcher")
    assert re.fullmatch(r"compiled CUDA kernels \(3, NVRTC\) in \d+\.\d s", message), message
