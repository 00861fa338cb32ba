"""The architecture map and the contributor guide point at code that exists, and the repository
points at no design outside itself.

``docs/ARCHITECTURE.md`` names modules (``client/_race.py``) and, after a colon, the functions
and classes in them (``client/_race.py``: ``Race.record``); ``CONTRIBUTING.md`` names modules and
test files. A rename that leaves the map behind fails here.
"""

from __future__ import annotations

import ast
import os
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


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
#: Any ``.py`` name on the page, with or without a folder, in backticks, tables or the diagram.
_ANY_MODULE = re.compile(r"(?<![\w/.])((?:[\w]+/)*[\w]+\.py)\b")
#: A dotted name of the package (``hedgerow.controller.store``).
_DOTTED = re.compile(r"\bhedgerow(?:\.\w+)+")


def _package_modules() -> dict[str, Path]:
    """Every module of the package, by its path below ``hedgerow/`` (the top-level folders are
    reached through the package's links), the Alembic revisions aside."""
    found: dict[str, Path] = {}
    package = ROOT / "hedgerow"
    for folder, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                found[path.relative_to(package).as_posix()] = path
    return {rel: path for rel, path in found.items() if not rel.startswith("migrations/versions/")}


def _page_modules() -> set[str]:
    """The module paths ARCHITECTURE.md names with their folder, as paths below ``hedgerow/``."""
    return {m.removeprefix("hedgerow/") for m in _ANY_MODULE.findall(ARCHITECTURE.read_text()) if "/" in m}


def test_every_module_and_package_architecture_names_exists() -> None:
    """A path (``controller/_publish.py``), a bare file name (``jobs.py`` in the diagram, which
    must then be a module of the package) or a dotted package (``hedgerow.controller.store``) on
    the page that no file answers fails here, wherever on the page it is written."""
    text = ARCHITECTURE.read_text()
    package = _package_modules()
    names = {Path(rel).name for rel in package}
    missing = []
    for module in sorted(set(_ANY_MODULE.findall(text))):
        if "/" in module:
            if not ((ROOT / module).is_file() or module.removeprefix("hedgerow/") in package):
                missing.append(module)
        elif module not in names:
            missing.append(module)
    for dotted in sorted(set(_DOTTED.findall(text))):
        path = ROOT.joinpath(*dotted.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
            missing.append(dotted)
    assert missing == [], f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"


def test_every_package_module_is_two_hops_from_architecture() -> None:
    """Every module is named on the page with its folder, or in the docstring of its package's
    ``__init__.py`` (the facade the page names): a new module that neither names fails here."""
    named = _page_modules()
    far = []
    for rel, path in sorted(_package_modules().items()):
        if path.name in ("__init__.py", "__main__.py") or rel in named:
            continue
        facade = path.parent / "__init__.py"
        docstring = ast.get_docstring(ast.parse(facade.read_text())) if facade.is_file() else None
        if docstring is None or not re.search(rf"\b{re.escape(path.stem)}\b", docstring):
            far.append(rel)
    assert far == [], f"name these in docs/ARCHITECTURE.md (or their package's docstring): {far}"
