"""Facade names imported from their home modules on first use (PEP 562).

A package facade lists where each public name lives and installs the returned function as its
module-level ``__getattr__``; the first access imports the home module and keeps the value in the
package's namespace, so later accesses are plain lookups. Importing the package (or one light
submodule of it) then costs nothing for the names not used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the package whose ``globals()`` is ``namespace``.

    Args:
        namespace: the package's ``globals()``; a name is stored there once imported.
        homes: public name -> dotted name of the module that defines it.

    Returns:
        ``__getattr__(name)``: the value of ``name`` from its home module.

    Raises:
        AttributeError: (from the returned function) ``name`` is not in ``homes``.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
