"""The architecture map and the contributor guide point at code that exists, and the repository
points at no design outside itself.

``docs/ARCHITECTURE.md`` names modules (``client/_race.py``) and, after a colon, the functions
and classes in them (``client/_race.py``: ``Race.record``); ``CONTRIBUTING.md`` names modules and
test files. A rename that leaves the map behind fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "ARCHITECTURE.md", ROOT / "CONTRIBUTING.md"]
#: `path/to/module.py`: `Name` or `Name.attr`, possibly several names after one module.
_MODULE = re.compile(r"`((?:client|controller|api|sim|hedgerow|migrations|tests|bench)/[\w/]+\.py)`")
_HOP = re.compile(r"`([\w/]+\.py)`: ((?:`[\w.]+`(?: / |, | and | → )?)+)")


def _defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of ``path``, and ``Class.method`` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_and_name_the_docs_give_exists(doc: Path) -> None:
    text = doc.read_text()
    modules = set(_MODULE.findall(text))
    assert modules, f"{doc.name} names no module"
    missing = sorted(m for m in modules if not any((ROOT / m).parent.glob(Path(m).name)))
    assert missing == [], f"{doc.name} names modules that do not exist: {missing}"
    for module, names in _HOP.findall(text):
        path = ROOT / module
        if not path.exists():
            continue
        defined = _defined_names(path)
        for name in re.findall(r"`([\w.]+)`", names):
            assert name in defined, f"{doc.name}: {module} has no {name}"


def test_nothing_in_the_repository_points_at_a_design_outside_it() -> None:
    outside = re.compile(r"shared/DESIGN\.md")
    hits = []
    for path in ROOT.rglob("*"):
        if path.suffix not in {".py", ".md", ".toml", ".html", ".j2", ".cfg"} or ".venv" in path.parts:
            continue
        if path == Path(__file__).resolve():
            continue
        if outside.search(path.read_text(errors="replace")):
            hits.append(str(path.relative_to(ROOT)))
    assert hits == []
    assert (ROOT / "docs" / "DESIGN.md").exists()
