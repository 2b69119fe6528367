"""A module of ours executed from its source, whatever is compiled (ADR 0021).

A core compiled with mypyc has no Python signature to read (``inspect.signature``
of its ``__init__`` is ``(*args, **kwargs)``); tests that read the signatures of
the pure cores (the defaults written once, ADR 0007) read them from the source.
"""

from __future__ import annotations

import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import ballast_asgi

_ROOT = Path(ballast_asgi.__file__).parent
_LOADED: dict[str, ModuleType] = {}


def pure(name: str) -> ModuleType:
    """``name`` (``ballast_asgi.x.y``) run from ``x/y.py`` under a private name."""
    found = _LOADED.get(name)
    if found is not None:
        return found
    path = _ROOT.joinpath(*name.split(".")[1:]).with_suffix(".py")
    private = "_pure_" + name.replace(".", "_")
    loader = SourceFileLoader(private, str(path))
    module = ModuleType(private)
    module.__file__ = str(path)
    module.__loader__ = loader
    sys.modules[private] = module  # dataclasses look their module up while building
    try:
        loader.exec_module(module)
    finally:
        del sys.modules[private]
    _LOADED[name] = module
    return module
