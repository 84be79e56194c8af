"""The `pagedserve` console entry point: applies the backends' process-wide native-library defaults, which must
be in the environment before NumPy loads, then runs the CLI."""

from __future__ import annotations

from backends.process import apply_process_defaults


def main() -> int:
    apply_process_defaults()  # every backend's: which one runs is known only once the CLI has parsed its config
    from service.cli.commands import main as cli_main  # noqa: PLC0415  (after the defaults: this imports NumPy)

    return cli_main()
