"""The import graph of our packages, read from the source (no module is imported): every `import` and
`from ... import` statement, at module level or inside a function or `if TYPE_CHECKING:`, relative ones
resolved against the importing module's package."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One of our modules importing another of ours: `target` is the module the statement loads (for
    `from a import b`, the module a.b when b is one, else a)."""

    importer: str
    path: Path
    line: int
    statement: str
    target: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.statement}` ({self.importer} -> {self.target})"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> source file, for every module of `packages` under `root`."""
    return {module_name(root, path): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def graph(root: Path, packages: tuple[str, ...]) -> list[Import]:
    """Every import, in any of `packages`, of a module of `packages`."""
    modules = find_modules(root, packages)
    return [imp for name, path in modules.items() for imp in imports_of(name, path, root, set(modules))]


def imports_of(module: str, path: Path, root: Path, known: set[str]) -> list[Import]:
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            statement, shown = ast.unparse(node), path.relative_to(root)
            found += [Import(module, shown, node.lineno, statement, target)
                      for target in targets(node, module, is_package, known)]
    return found


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ours that `node` loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if _ours(alias.name, known)]
    base = resolve_from(node, module, is_package)
    loaded = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    return [name for name in dict.fromkeys(loaded) if _ours(name, known)]


def resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module a `from X import ...` names; `from . import` is relative to the
    importer's package (a package's `__init__` is its own package)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > len(package):
        raise ValueError(f"{module}: relative import beyond the top-level package (line {node.lineno})")
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _ours(name: str, known: set[str]) -> bool:
    return name.split(".")[0] in known  # each of our packages has an __init__, so its top level is known


def module_cycles(imports: list[Import]) -> list[list[str]]:
    """Each group of modules that import each other, directly or through others (a strongly connected
    component of more than one module), its modules sorted; the groups sorted by their first module."""
    targets: dict[str, set[str]] = {}
    for imp in imports:
        targets.setdefault(imp.importer, set()).add(imp.target)
    return sorted(sorted(group) for group in _components(targets) if len(group) > 1)


def _components(targets: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iterative (an import chain may be deeper than the stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(targets):
        if root in index:
            continue
        work = [(root, iter(sorted(targets.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c not in index or c in stack), None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while (member := stack.pop()) != node:
                        group.add(member)
                    found.append(group | {node})
            elif child in index:
                low[node] = min(low[node], index[child])
            else:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(targets.get(child, ())))))
    return found
