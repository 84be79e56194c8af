"""What tests/test_suite_rules.py checks in the test files' syntax trees: test functions that assert nothing, and
skips that bypass tests/required.py.

A test checks something when it (or a function nested in it) has an assert statement, names an assert* function
(np.testing.assert_allclose, called or handed to functools.partial), calls pytest.raises / fail / warns, or calls
a helper of tests/ that does one of these, to any depth. Helpers are resolved as Python would find them: a
function of the same module, one imported from a tests module (`from tests.x import f`, `x.f()` after
`from tests import x`), or a method of the same module's classes called on self. A method of another object is
not followed: a test that checks only through one asserts on what it returns, or is allow-listed."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
Key = tuple[str, str]  # (module, function name)
# pytest's own ways to fail a test: a call of pytest.<name>
PYTEST_CHECKS = frozenset({"raises", "fail", "warns", "deprecated_call"})
# pytest's ways to skip: pytest.<name>(...) and pytest.mark.<name>
PYTEST_SKIPS = frozenset({"skip", "importorskip", "xfail", "skipif"})


@dataclass(frozen=True)
class Found:
    path: Path
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


@dataclass
class Module:
    name: str  # tests.x.y
    path: Path
    tree: ast.Module
    imported: dict[str, Key]  # local name -> the tests function it is
    modules: dict[str, str]  # local name -> the tests module it is


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def functions(tree: ast.AST) -> Iterator[FunctionNode]:
    """Every function and method, nested ones too."""
    return (node for node in ast.walk(tree) if isinstance(node, FunctionNode))


def tests_in(tree: ast.Module) -> Iterator[FunctionNode]:
    """pytest's tests: test_* at module level and in Test* classes."""
    for node in tree.body:
        if isinstance(node, FunctionNode) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from (f for f in node.body if isinstance(f, FunctionNode) and f.name.startswith("test"))


def is_pytest_attr(node: ast.AST, names: frozenset[str]) -> bool:
    """pytest.<name> or pytest.mark.<name>, for a name in `names`."""
    if not isinstance(node, ast.Attribute) or node.attr not in names:
        return False
    owner = node.value
    if isinstance(owner, ast.Attribute) and owner.attr == "mark":
        owner = owner.value
    return isinstance(owner, ast.Name) and owner.id == "pytest"


def names_an_assert(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id.startswith("assert")) or (
        isinstance(node, ast.Attribute) and node.attr.startswith("assert"))


def checks_directly(function: FunctionNode) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert) or names_an_assert(node):
            return True
        if isinstance(node, ast.Call) and is_pytest_attr(node.func, PYTEST_CHECKS):
            return True
    return False


def module_name(path: Path, tests: Path) -> str:
    return ".".join(("tests", *path.relative_to(tests).with_suffix("").parts))


def imports_of(tree: ast.Module, known: set[str]) -> tuple[dict[str, Key], dict[str, str]]:
    """The functions and modules of tests/ that `tree` imports, by the names it knows them by."""
    imported: dict[str, Key] = {}
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                local, full = alias.asname or alias.name, f"{node.module}.{alias.name}"
                if full in known:
                    modules[local] = full
                elif node.module in known:
                    imported[local] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
    return imported, modules


def load(paths: list[Path], tests: Path) -> list[Module]:
    trees = {module_name(p, tests): (p, parse(p)) for p in paths}
    known = set(trees)
    return [Module(name, path, tree, *imports_of(tree, known)) for name, (path, tree) in trees.items()]


def callee(call: ast.Call, module: Module) -> Key | None:
    """The tests function a call runs, where it can be told without running the code."""
    func = call.func
    if isinstance(func, ast.Name):
        return module.imported.get(func.id, (module.name, func.id))
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id in module.modules:
            return module.modules[func.value.id], func.attr
        if func.value.id in ("self", "cls"):
            return module.name, func.attr
    return None


def callees(function: FunctionNode, module: Module) -> set[Key]:
    return {key for node in ast.walk(function) if isinstance(node, ast.Call) and (key := callee(node, module))}


def asserting_helpers(modules: list[Module]) -> set[Key]:
    """Every (module, name) of a function that checks something, itself or through the helpers it calls."""
    calls = {(m.name, f.name, id(f)): callees(f, m) for m in modules for f in functions(m.tree)}
    found = {(m.name, f.name) for m in modules for f in functions(m.tree) if checks_directly(f)}
    grew = True
    while grew:
        more = {(module, name) for (module, name, _), keys in calls.items() if keys & found} - found
        grew, found = bool(more), found | more
    return found


def hollow_tests(paths: list[Path], tests: Path) -> list[Found]:
    """Test functions (in files named test_*) that check nothing, themselves or through a helper."""
    modules = load(paths, tests)
    helpers = asserting_helpers(modules)
    return [Found(m.path, test.lineno, test.name) for m in modules if m.path.name.startswith("test_")
            for test in tests_in(m.tree) if not checks_directly(test) and not callees(test, m) & helpers]


def is_mark(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"


def skips(path: Path) -> list[Found]:
    """pytest.skip(...), pytest.importorskip(...), pytest.xfail(...) and pytest.mark.skip / skipif / xfail, called
    or not (pytest.skip.Exception, which tests of the helpers catch, is neither)."""
    found = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Call) and is_pytest_attr(node.func, PYTEST_SKIPS):
            found.add(Found(path, node.lineno, ast.unparse(node.func)))
        elif is_mark(node) and is_pytest_attr(node, PYTEST_SKIPS):
            found.add(Found(path, node.lineno, ast.unparse(node)))
    return sorted(found, key=lambda f: f.line)
