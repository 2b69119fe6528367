"""Lazy package attributes: a name is imported from its module on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
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
