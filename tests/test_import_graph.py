"""The import scanner the package rules rest on: absolute, relative and function-level imports, each resolved
to the module it loads; imports of other libraries ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import graph, module_cycles

FILES = {
    "app/__init__.py": "from . import core\n",
    "app/core.py": ("import os\n"
                    "from typing import TYPE_CHECKING\n"
                    "from .util import helper, other\n"
                    "if TYPE_CHECKING:\n"
                    "    from lib.types import Thing\n"
                    "def run():\n"
                    "    import lib.io\n"
                    "    from lib import io, VERSION\n"),
    "app/util.py": "",
    "app/sub/__init__.py": "from .. import util\nfrom ..core import run\n",
    "lib/__init__.py": "",
    "lib/io.py": "",
    "lib/types.py": "import app as application\n",
}


def write_tree(root: Path) -> None:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_each_import_resolves_to_the_module_it_loads(tmp_path: Path) -> None:
    write_tree(tmp_path)
    found = {(imp.importer, imp.line, imp.target) for imp in graph(tmp_path, ("app", "lib"))}
    assert found == {
        ("app", 1, "app.core"),
        ("app.core", 3, "app.util"),
        ("app.core", 5, "lib.types"),
        ("app.core", 7, "lib.io"),
        ("app.core", 8, "lib.io"), ("app.core", 8, "lib"),  # VERSION is no module: it loads the package
        ("app.sub", 1, "app.util"),
        ("app.sub", 2, "app.core"),
        ("lib.types", 1, "app"),
    }


def test_the_message_names_file_line_and_statement(tmp_path: Path) -> None:
    write_tree(tmp_path)
    imp = next(i for i in graph(tmp_path, ("app", "lib")) if i.importer == "app.sub" and i.line == 2)
    assert str(imp) == "app/sub/__init__.py:2: `from ..core import run` (app.sub -> app.core)"


def test_a_relative_import_past_the_top_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("from ... import x\n")
    with pytest.raises(ValueError, match="beyond the top-level package"):
        graph(tmp_path, ("app",))


def test_modules_that_import_each_other_through_others_are_one_cycle(tmp_path: Path) -> None:
    write_tree(tmp_path)  # app -> app.core -> lib.types -> app; app.sub and lib.io are in none
    assert module_cycles(graph(tmp_path, ("app", "lib"))) == [["app", "app.core", "lib.types"]]
    (tmp_path / "lib" / "types.py").write_text("")
    assert module_cycles(graph(tmp_path, ("app", "lib"))) == []
