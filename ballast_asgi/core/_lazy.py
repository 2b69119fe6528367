"""Lazy package attributes, and the old paths of moved modules.

``lazy_getattr``: a name is imported from its module on first use.
``moved_modules``: a module that moved keeps its old dotted path for one
release (a meta-path finder hands out the same module object).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Mapping
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def lazy_getattr(
    package: str, names: Mapping[str, str], into: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``names`` (name -> module), caching in ``into``."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        into[name] = value
        return value

    return getattr_


class _Alias(importlib.abc.Loader):
    """Loads an old module path as the module now at ``target`` (the same object)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module is already executed."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``moved`` (old dotted path -> new) under their old names."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        new = self.moved.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def moved_modules(package: str, moved: Mapping[str, str]) -> None:
    """Keep ``package.<old>`` importable as ``package.<new>`` for every pair of ``moved``."""
    table = {f"{package}.{old}": f"{package}.{new}" for old, new in moved.items()}
    if not any(isinstance(f, _MovedFinder) and f.moved == table for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder(table))
