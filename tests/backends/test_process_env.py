"""The entry point sets the native-library defaults before anything loads NumPy, and keeps the user's values;
a backend without process defaults gets none."""

from __future__ import annotations

import os
import subprocess
import sys

from backends.numpy_backend.process_env import DEFAULTS

# the launcher, with a CLI that reports what it finds in place of the real one
LAUNCH = ("import os, sys, types; cli = types.ModuleType('service.cli.commands'); "
          "sys.modules['service.cli.commands'] = cli; "
          "cli.main = lambda: print('numpy' in sys.modules, os.environ.get('OPENBLAS_THREAD_TIMEOUT')) or 0; "
          "from service.cli.launch import main; sys.exit(main())")
APPLY = ("import os, sys; from backends.process import apply_process_defaults as apply; "
         "print('numpy' in sys.modules, apply({name}), os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")


def run_python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def without_defaults() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DEFAULTS}


def test_launcher_applies_defaults_before_numpy() -> None:
    assert run_python(LAUNCH, without_defaults()) == f"False {DEFAULTS['OPENBLAS_THREAD_TIMEOUT']}"


def test_user_setting_wins() -> None:
    assert run_python(LAUNCH, {**os.environ, "OPENBLAS_THREAD_TIMEOUT": "26"}) == "False 26"


def test_defaults_follow_the_named_backend() -> None:
    expected = DEFAULTS["OPENBLAS_THREAD_TIMEOUT"]
    assert run_python(APPLY.format(name="'numpy'"), without_defaults()) == f"False True {expected}"
    assert run_python(APPLY.format(name="'sim'"), without_defaults()) == "False True None"


def test_defaults_after_numpy_say_so() -> None:
    code = "import numpy; " + APPLY.format(name="None")
    assert run_python(code, without_defaults()) == f"True False {DEFAULTS['OPENBLAS_THREAD_TIMEOUT']}"
