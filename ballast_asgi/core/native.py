"""Compiled cores (ADR 0021): mypyc builds of the hot pure modules, used only when current.

``make native`` (``python -m ballast_tools.native``) compiles ``MODULES`` with
mypyc into ``ballast_asgi/.native/`` (not next to the sources, so a compiled
module can never shadow an edited one) and writes a manifest with the SHA-256
of each module's source. ``install()``, run first by ``ballast_asgi/__init__``,
puts a finder in front of the import system that loads those builds instead of
the sources, and only when every source still has the digest it was compiled
from and the interpreter is the one it was compiled for. Anything else (no
build, a stale one, another Python, ``BALLAST_NATIVE=0``) imports the sources,
which are the reference: the same code, slower.

Standard library only: it runs before anything else of the package.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Any

try:  # a compiled class's options, written ``@mypyc_attr(allow_interpreted_subclasses=True)``
    # where the class stays open to subclasses written in Python (mypyc reads the call)
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # installed with mypy, which compiles: without it nothing is compiled

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls


#: The modules compiled: the pure cores, the header code and the request's path through
#: the stages, the lane and the lean client, which every proxied request runs (ADR 0021
#: says how they were chosen and what a compiled module may not do). ``Limiter`` is
#: ``LimiterCore`` subclassed in Python (``limiter.py``): the tests track limiters with
#: weak references, which a compiled object's deallocation does not clear. The server
#: protocol and the lean connection subclass uvicorn's and asyncio's classes; the proxy
#: app and its relay await inside ``except`` and ``finally`` (which compiled coroutines
#: get wrong, mypyc#1114) and are off the lane's path anyway.
MODULES = (
    "ballast_asgi.core.breaker",
    "ballast_asgi.core.breaker_set",
    "ballast_asgi.core.breaker_stats",
    "ballast_asgi.core.breaker_ticket",
    "ballast_asgi.core.capacity",
    "ballast_asgi.core.classify",
    "ballast_asgi.core.forwarded",
    "ballast_asgi.core.head",
    "ballast_asgi.core.limit.gradient",
    "ballast_asgi.core.limit.route_floors",
    "ballast_asgi.core.limiter_core",
    "ballast_asgi.core.limiter_partitions",
    "ballast_asgi.core.limiter_permit",
    "ballast_asgi.core.limiter_windows",
    "ballast_asgi.core.loop_lag",
    "ballast_asgi.core.retry_budget",
    "ballast_asgi.core.routes",
    "ballast_asgi.proxy.headers",
    # the request's path through the stages, the lane (ADR 0020) and the lean client
    "ballast_asgi.middleware.context",
    "ballast_asgi.middleware.admission",
    "ballast_asgi.middleware.pipeline",
    "ballast_asgi.middleware.at_wire",
    "ballast_asgi.middleware.concurrency",
    "ballast_asgi.proxy.laned",
    "ballast_asgi.gateway.lane",
    "ballast_asgi.middleware.breaker",
    "ballast_asgi.middleware.retry",
    "ballast_asgi.middleware.retry_attempt",
    "ballast_asgi.server.cycle",
    "ballast_asgi.proxy.transports.lean",
    "ballast_asgi.proxy.transports.direct",
    "ballast_asgi.proxy.transports.lean_wire",
    "ballast_asgi.core.outcome",
    "ballast_asgi.middleware.limit_route",
    "ballast_asgi.middleware.queueing",
    "ballast_asgi.proxy.calls",
    "ballast_asgi.gateway.hooks",
    "ballast_asgi.telemetry.loop_lag",
    "ballast_asgi.telemetry.hot_values",
)
#: Which of ``MODULES`` are the request's path rather than pure cores or header code.
REQUEST_PATH = frozenset(MODULES[MODULES.index("ballast_asgi.proxy.headers") + 1 :])
#: mypyc's group name; its shared library is the top-level module ``LIBRARY``.
GROUP = "ballast_asgi_native"
LIBRARY = f"{GROUP}__mypyc"
PACKAGE = Path(__file__).resolve().parent.parent
DIR = PACKAGE / ".native"
MANIFEST = DIR / "manifest.json"
#: The environment variable that turns the builds off (``0``).
ENV = "BALLAST_NATIVE"

_active = False
#: Why ``install`` left the sources in use (None: it did not run, or they are compiled).
_why: str | None = None


def source(name: str) -> Path:
    """The source file of module ``name``."""
    return PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")


def digest(name: str) -> str:
    """SHA-256 of module ``name``'s source."""
    return hashlib.sha256(source(name).read_bytes()).hexdigest()


def tag() -> str:
    """The interpreter a build is for (cache tag and extension suffix)."""
    return f"{sys.implementation.cache_tag}{EXTENSION_SUFFIXES[0]}"


def built(name: str, root: Path = DIR) -> Path:
    """Where the build of module ``name`` is under ``root``."""
    return root.joinpath(*name.split(".")).with_name(name.split(".")[-1] + EXTENSION_SUFFIXES[0])


def stale(root: Path = DIR) -> str | None:
    """Why the builds under ``root`` cannot be used (None: they can)."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return "no build (make native)"
    if not isinstance(manifest, dict) or manifest.get("tag") != tag():
        return "built for another interpreter"
    digests = manifest.get("modules")
    if not isinstance(digests, dict) or set(digests) != set(MODULES):
        return "built from another module list"
    for name in MODULES:
        if digests[name] != digest(name) or not built(name, root).is_file():
            return f"{name} changed since it was compiled"
    if not built(LIBRARY, root).is_file():
        return "the group library is missing"
    return None


class _Finder:
    """Finds the compiled modules (and mypyc's group library) under ``root``."""

    def __init__(self, root: Path) -> None:
        self.files = {name: built(name, root) for name in (*MODULES, LIBRARY)}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return spec_from_file_location(
            fullname, file, loader=ExtensionFileLoader(fullname, str(file))
        )


def install() -> bool:
    """Load the compiled modules from now on when they are current; whether they are."""
    global _active, _why
    if _active:
        return True
    if os.environ.get(ENV, "1") == "0":
        _why = f"off ({ENV}=0)"
        return False
    if any(name in sys.modules for name in MODULES):
        _why = "the sources were imported first"
        return False
    _why = stale()
    if _why is not None:
        return False
    finder = _Finder(DIR)
    sys.meta_path.insert(0, finder)
    try:  # the group library holds all the code: a damaged or foreign build fails here
        importlib.import_module(LIBRARY)
    except (ImportError, OSError) as exc:
        sys.meta_path.remove(finder)
        sys.modules.pop(LIBRARY, None)
        _why = f"the build does not load ({exc})"
        return False
    _active = True
    return True


def active() -> bool:
    """Whether the compiled modules are the ones imported in this process."""
    return _active


def status() -> dict[str, object]:
    """For ``/snapshot``: compiled or not, and why not."""
    reason = None if _active else (_why or "not installed")
    return {"compiled": _active, "modules": len(MODULES) if _active else 0, "why_not": reason}
