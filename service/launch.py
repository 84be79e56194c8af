"""The `pagedserve` console entry point: applies the process-wide native-library defaults, which must be in
the environment before NumPy loads, then runs the CLI."""

from __future__ import annotations

from backends.numpy_backend.process_env import apply_defaults


def main() -> int:
    apply_defaults()
    from service.cli import main as cli_main  # noqa: PLC0415  (after the defaults: this imports NumPy)

    return cli_main()
