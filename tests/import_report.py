"""Numbers on the shape of `service/`, for a change's note: `python -m tests.import_report`.

- files per package: the .py files of each folder of service/ (`__init__.py` included);
- import edges: pairs of service modules one imports the other in (any statement: in a function, under
  TYPE_CHECKING; tests/import_graph.py);
- levels: the longest chain of imports inside service/, in modules;
- the chat path: the service files whose functions run while the server handles one streamed chat completion
  (the sim backend, from the middleware to `data: [DONE]`), and for each the other service files it is
  called from; a file called from more than one is visited more than once;
- cycles: groups of modules of all our packages that import each other, directly or not.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any

from tests.import_graph import find_modules, graph, module_cycles
from tests.test_import_rules import PACKAGES, ROOT


def report() -> list[str]:
    imports = graph(ROOT, PACKAGES)
    service = find_modules(ROOT, ("service",))
    per_package = Counter(str(path.parent.relative_to(ROOT)) for path in service.values())
    edges = {(i.importer, i.target) for i in imports if i.importer in service and i.target in service
             and i.importer != i.target}
    cycles = module_cycles(imports)
    lines = [f"files in service/: {len(service)}"]
    lines += [f"  {package}/: {count}" for package, count in sorted(per_package.items())]
    lines += [f"import edges inside service/: {len(edges)}", f"levels inside service/: {levels(edges)}"]
    lines += chat_path_lines()
    lines += [f"import cycles between modules: {len(cycles)}"] + ["  " + " <-> ".join(c) for c in cycles]
    return lines


def levels(edges: set[tuple[str, str]]) -> int:
    """Modules on the longest import chain (a cycle's modules count once)."""
    targets: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        targets[a].add(b)

    @cache
    def depth(module: str, seen: frozenset[str]) -> int:
        return 1 + max((depth(t, seen | {module}) for t in targets[module] if t not in seen), default=0)

    return max(depth(m, frozenset()) for m in list(targets))


def chat_path_lines() -> list[str]:
    callers = trace_chat_request()
    lines = [f"files on a streamed chat completion's path: {len(callers)}, "
             f"entered from more than one service file: {sum(len(c) > 1 for c in callers.values())}"]
    return lines + [f"  {f} <- {', '.join(sorted(c)) or '(aiohttp)'}" for f, c in sorted(callers.items())]


def trace_chat_request() -> dict[str, set[str]]:
    """Service file -> the service files that called into it, during one streamed chat completion."""
    from backends.model.loader import open_model  # noqa: PLC0415  (the numbers above need no model)
    from tests.service.live import LiveServer, cached_builder, sim_config  # noqa: PLC0415
    from tests.service.rawhttp import post  # noqa: PLC0415

    callers: dict[str, set[str]] = {}
    recording = threading.Event()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not recording.is_set():
            return
        callee = _service_file(frame)
        if callee:
            caller = _service_file(frame.f_back) if frame.f_back else None
            callers.setdefault(callee, set()).update([caller] if caller and caller != callee else [])

    threading.setprofile(profile)  # the server's loop and tokenizer threads start after this
    try:
        server = LiveServer.start(sim_config(), cached_builder(open_model()[1]))
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "stream": True}
        recording.set()
        reply = post(server.url + "/v1/chat/completions", body)
        recording.clear()
        server.close()
    finally:
        threading.setprofile(None)
    assert reply.body.rstrip().endswith(b"data: [DONE]"), reply.body[-200:]
    return callers


def _service_file(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT / "service") else None


if __name__ == "__main__":
    sys.exit(print("\n".join(report())))
