"""The entry point sets the native-library defaults before anything loads NumPy, and keeps the user's values."""

from __future__ import annotations

import os
import subprocess
import sys

from backends.numpy_backend.process_env import DEFAULTS

PROBE = ("import os, sys; import service.launch as l; from backends.numpy_backend.process_env import apply_defaults; "
         "print('numpy' in sys.modules, apply_defaults(), os.environ['OPENBLAS_THREAD_TIMEOUT'])")


def run_probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_launcher_applies_defaults_before_numpy() -> None:
    env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    assert run_probe(env) == f"False True {DEFAULTS['OPENBLAS_THREAD_TIMEOUT']}"


def test_user_setting_wins() -> None:
    assert run_probe({**os.environ, "OPENBLAS_THREAD_TIMEOUT": "26"}).endswith(" 26")
