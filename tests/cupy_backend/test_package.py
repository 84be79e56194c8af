"""Without CuPy: the package imports (and never imports CuPy itself), and creating the backend fails with one
clear message naming the `cuda` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.config import BackendConfig
from backends.cupy_backend import create
from backends.model.loader import open_model
from backends.registry import create_backend
from tests.cuda.toolchain import REPO
from tests.cupy_backend.tiny_model import write_tiny_llama_d64

EXTRA = "pip install 'pagedserve[cuda]'"
MODULES = ("backend", "device", "device_model", "forward", "gemm", "launch", "launcher", "ops", "projections",
           "quant_ops", "quant_weights", "reference", "source", "step_inputs", "storage", "synthetic")


def test_importing_every_module_does_not_import_cupy() -> None:
    imports = "; ".join(f"import backends.cupy_backend.{m}" for m in MODULES)
    code = f"import sys; {imports}; assert 'cupy' not in sys.modules, 'cupy was imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` now raises ImportError


def test_create_without_cupy_names_the_cuda_extra(no_cupy: None, tmp_path: Path) -> None:
    _, files = open_model(write_tiny_llama_d64(tmp_path / "m.gguf"))
    with pytest.raises(BackendError, match=r"pip install 'pagedserve\[cuda\]'"):
        create(BackendConfig(name="cupy"), files)


def test_registry_reports_the_same_message(no_cupy: None, tmp_path: Path) -> None:
    _, files = open_model(write_tiny_llama_d64(tmp_path / "m.gguf"))
    with pytest.raises(BackendError) as info:
        create_backend(BackendConfig(name="cupy", dtype="bfloat16"), files)
    assert EXTRA in str(info.value) and "\n" not in str(info.value)
