"""What each package may import, checked on every import statement of every module of ours (inside functions
and under TYPE_CHECKING too), and that no packages, and no modules, import each other in a cycle. No
exceptions: code that breaks a rule is fixed, or the rule is changed here, for everyone."""

from __future__ import annotations

from collections import deque
from itertools import pairwise
from pathlib import Path

import pytest

from tests.import_graph import Import, find_modules, graph, module_cycles

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "scheduler", "kvpool", "backends", "telemetry", "bench")
SERVICE_PARTS = ("service.cli", "service.app", "service.dashboard", "service.routes", "service.generation",
                 "service.http", "service.openai", "service.config")
PARTS = ("bench.loadgen", *SERVICE_PARTS, "service", "scheduler", "kvpool", "backends", "telemetry",
         "bench")  # most specific first
BELOW_SERVICE = ("scheduler", "backends", "kvpool", "telemetry")

# what each part may import besides itself: these modules and the modules under them
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "kvpool": (),
    "telemetry": (),
    "backends": ("kvpool",),
    # the backend contract (steps, outputs, step cost), never a backend; telemetry only through its interface
    "scheduler": ("kvpool", "backends.base", "backends.step_shape", "telemetry.interface"),
    # service/ imports downwards: cli -> app -> (dashboard ->) routes -> (generation, http) -> openai -> config
    "service": ("service.cli",),  # `python -m service`
    "service.cli": ("service.app", "service.config", *BELOW_SERVICE),
    "service.app": ("service.dashboard", "service.routes", "service.generation", "service.http", "service.openai",
                    "service.config", *BELOW_SERVICE),
    # the live view: its own routes beside the API's, reading the engine's views (scheduler/engine_view.py)
    "service.dashboard": ("service.routes.common", "service.generation", "service.http", "service.openai",
                          "service.config", *BELOW_SERVICE),
    "service.routes": ("service.generation", "service.http", "service.openai", "service.config", *BELOW_SERVICE),
    "service.generation": ("service.openai", "service.config", *BELOW_SERVICE),  # no plumbing, no routes
    # the plumbing knows OpenAI's API only by the error shape every answer uses, and the API imports no plumbing
    "service.http": ("service.openai.errors", "service.config", *BELOW_SERVICE),
    "service.openai": BELOW_SERVICE,
    "service.config": BELOW_SERVICE,  # imports nothing else of service/: everything else reads it
    "bench.loadgen": (),  # a pure HTTP client: it measures any OpenAI-compatible server
    # benchmarks and experiments drive every layer, the service's own parts too; nothing imports them
    "bench": ("service", "scheduler", "backends", "kvpool", "telemetry", "bench.loadgen"),
}


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def part(module: str) -> str:
    return next(p for p in PARTS if within(module, p))


def allowed(imp: Import) -> bool:
    source = part(imp.importer)
    return part(imp.target) == source or any(within(imp.target, p) for p in MAY_IMPORT[source])


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return graph(ROOT, PACKAGES)


def test_every_part_is_scanned() -> None:
    assert {part(module) for module in find_modules(ROOT, PACKAGES)} == set(PARTS) == set(MAY_IMPORT)


def test_every_import_follows_the_package_rules(imports: list[Import]) -> None:
    broken = [f"{imp}: {part(imp.importer)} may import {', '.join(MAY_IMPORT[part(imp.importer)]) or 'nothing'} "
              f"of ours" for imp in imports if not allowed(imp)]
    assert not broken, "imports that break the package rules:\n" + "\n".join(broken)


def test_no_import_cycle_between_packages(imports: list[Import]) -> None:
    edges = part_edges(imports)
    cycles: dict[frozenset[str], list[str]] = {}
    for a, b in edges:
        back = path_between(edges, b, a)
        if back:
            cycles.setdefault(frozenset(back), [a, *back])
    described = ["\n".join(str(edges[pair]) for pair in pairwise(cycle)) for cycle in cycles.values()]
    assert not described, "import cycles between packages, one import per step:\n" + "\n\n".join(described)


def test_no_import_cycle_between_modules(imports: list[Import]) -> None:
    """A cycle is broken where it starts (a type in the wrong module, two halves of one job), never by moving
    an import into a function or under TYPE_CHECKING: those imports count here too."""
    described = ["\n".join(str(imp) for imp in imports if imp.importer in group and imp.target in group)
                 for group in map(set, module_cycles(imports))]
    assert not described, "modules that import each other, with the imports between them:\n" + "\n\n".join(described)


def part_edges(imports: list[Import]) -> dict[tuple[str, str], Import]:
    """Each pair of parts one imports the other in, with the first such import found."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        pair = (part(imp.importer), part(imp.target))
        if pair[0] != pair[1]:
            edges.setdefault(pair, imp)
    return edges


def path_between(edges: dict[tuple[str, str], Import], start: str, goal: str) -> list[str]:
    """A shortest chain of parts from start to goal, both included ([] when there is none)."""
    paths, queue = {start: [start]}, deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            return paths[node]
        for nxt in sorted(b for a, b in edges if a == node and b not in paths):
            paths[nxt] = [*paths[node], nxt]
            queue.append(nxt)
    return []
