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


def on_the_sources(nodeid: str) -> bool:
    """Whether a test that patches our functions or methods runs its body here.

    Its instrumentation (a module function or a method replaced by a counting one)
    cannot see inside compiled code, which calls the original directly. On the
    sources it runs here (True). With the compiled modules in use, this test is run
    on the sources in a fresh interpreter (``BALLAST_NATIVE=0``), asserted to pass,
    and False is returned: nothing more to do in this process.
    """
    import os
    import subprocess

    from ballast_asgi.core import native

    if not native.active():
        return True
    env = {**os.environ, native.ENV: "0"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid],
        cwd=_ROOT.parent, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"{nodeid} on the sources:\n{out.stdout[-3000:]}"
    assert "1 passed" in out.stdout, out.stdout[-500:]
    return False
