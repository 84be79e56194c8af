"""Process-wide settings a backend needs in place before its native libraries load, for entry points to apply
first thing. Importing this never loads NumPy: each backend's defaults live in a module of their own that
imports only the standard library."""

from __future__ import annotations

from collections.abc import Callable

from backends.numpy_backend import process_env

# backend name -> what sets its defaults (False: they came too late); backends not named here need none
PROCESS_DEFAULTS: dict[str, Callable[[], bool]] = {"numpy": process_env.apply_defaults}


def apply_process_defaults(backend: str | None = None) -> bool:
    """Sets `backend`'s process defaults that are missing (a value the user set is kept); with None, those of
    every built-in backend, for an entry point that applies them before it has read which backend to run.
    False when some came too late to take effect."""
    names = list(PROCESS_DEFAULTS) if backend is None else [backend]
    applied = [PROCESS_DEFAULTS[name]() for name in names if name in PROCESS_DEFAULTS]
    return all(applied)
