"""The load generator is a pure HTTP client: none of its modules imports the server's packages (the CLI layer,
which may load a tokenizer, excepted)."""

from __future__ import annotations

import ast
from pathlib import Path

import bench.loadgen

SERVER_PACKAGES = {"backends", "scheduler", "service", "kvpool", "telemetry"}
CLI_LAYER = {"cli.py", "__main__.py"}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_load_generator_imports_nothing_of_the_server() -> None:
    folder = Path(bench.loadgen.__file__).parent
    modules = [p for p in folder.glob("*.py") if p.name not in CLI_LAYER]
    assert len(modules) > 10
    offenders = {p.name: imported_packages(p) & SERVER_PACKAGES for p in modules}
    assert not {name: pkgs for name, pkgs in offenders.items() if pkgs}
