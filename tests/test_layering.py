"""The architecture, executable: ADR 0005's units, the arrows allowed between them, pure cores.

Every module of ``ballast_asgi`` belongs to exactly one *unit* (a package, or a
capability's pure ``core/`` subpackage); ``ARROWS`` is the table of units each
unit may import (ADR 0005 draws the same table). Every import counts: module
level, inside functions, and under ``TYPE_CHECKING``. A wrong arrow, a loose
module at the top, an import circle between modules, a third-party import in a
pure core, or a pure core that pulls in something heavy in a fresh interpreter
fails the build.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ballast_asgi"

#: The pure cores: standard library only, time and randomness as arguments.
CORES = ("core", "canary.core", "client.core", "discovery.core", "ratelimit.core", "upstreams.core")
#: Every unit and what it may import besides itself (ADR 0005, "The arrows").
_BASE = {"core"}
ARROWS: dict[str, set[str]] = {
    "core": set(),
    "canary.core": _BASE,
    "client.core": _BASE,
    "discovery.core": _BASE,
    "ratelimit.core": _BASE,
    "upstreams.core": _BASE,
    "config": {*CORES},
    "telemetry": {"core", "config"},
    "ratelimit": {"core", "ratelimit.core", "config", "telemetry"},
    "middleware": {"core", "config", "telemetry", "ratelimit", "ratelimit.core"},
    "proxy": {"core", "config", "telemetry", "middleware", "ratelimit"},
    "ops": {"core", "config", "telemetry", "middleware"},
    "upstreams": {"core", "upstreams.core", "config", "telemetry", "middleware", "proxy"},
    "discovery": {
        *("core", "discovery.core", "config", "telemetry", "middleware", "proxy"),
        *("upstreams.core", "upstreams"),
    },
    "canary": {
        *("core", "canary.core", "config", "telemetry", "middleware", "proxy", "ops"),
        *("upstreams.core", "upstreams"),
    },
    "client": {"core", "client.core", "config", "telemetry", "middleware"},
    "gateway": {
        *CORES,
        *("config", "telemetry", "ratelimit", "middleware", "proxy", "ops"),
        *("upstreams", "discovery", "canary", "client"),
    },
    "server": {
        *CORES,
        *("config", "telemetry", "ratelimit", "middleware", "proxy", "ops"),
        *("upstreams", "discovery", "canary", "client", "gateway", "top"),
    },
    # ballast_asgi/__init__.py (lazy public names) and __main__.py (the CLI)
    "top": {"core", "config", "middleware", "gateway", "server"},
}
#: Arrows that exist today and are being removed (issue 29); each must go, not grow.
PENDING: set[tuple[str, str]] = set()
HEAVY = (
    *("starlette", "fastapi", "httpx", "aiohttp", "prometheus_client", "pydantic", "yaml"),
    *("uvicorn", "anyio", "redis", "aetcd", "websockets", "httptools", "multidict"),
)
#: Modules longer than this say why in their docstring ("Longer than ...").
MAX_LINES = 320
#: Long today, being split (issue 29); each must shrink or say why, never grow in number.
LONG_TODAY: set[str] = set()


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _unit(module: str) -> str | None:
    rel = module.removeprefix("ballast_asgi").lstrip(".")
    if rel in ("", "__main__"):
        return "top"
    for unit in sorted(ARROWS, key=len, reverse=True):
        if rel == unit or rel.startswith(unit + "."):
            return unit
    return None


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """Every ``ballast_asgi`` module or name imported by ``path`` (dotted), with its line."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)


MODULES = dict(_modules())


def _own_imports(path: Path) -> set[str]:
    """The modules of ours ``path`` imports (``from pkg import module`` counts as the module)."""
    return {name for name, _ in _imports(path) if name in MODULES}


def test_every_module_belongs_to_a_unit() -> None:
    """No loose module: the top level holds packages plus ``__init__`` and ``__main__``."""
    loose = sorted(m for m in MODULES if _unit(m) is None)
    assert not loose, f"modules outside every unit of ADR 0005: {loose}"
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"], top


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_arrows(module: str) -> None:
    """Every import from one unit into another is an arrow of the table."""
    unit = _unit(module)
    assert unit is not None
    wrong = []
    for name in sorted(_own_imports(MODULES[module])):
        target = _unit(name)
        assert target is not None, name
        if target != unit and target not in ARROWS[unit] and (unit, target) not in PENDING:
            wrong.append(f"{name} ({unit} -> {target})")
    assert not wrong, f"{module} imports against ADR 0005's arrows: {wrong}"


def test_no_import_circle_between_modules() -> None:
    """The module import graph (every import but ``TYPE_CHECKING`` ones) has no cycle."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges.add(node.module)
                edges.update(f"{node.module}.{a.name}" for a in node.names)
        graph[module] = {e for e in edges if e in MODULES and e != module}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, " -> ".join(cycle)


def test_no_arrow_is_pending() -> None:
    """Every wrong arrow of issue 29 is gone; a new one goes in the table or not at all."""
    assert set() == PENDING


def _core_files() -> list[tuple[str, Path]]:
    return [(m, p) for m, p in MODULES.items() if _unit(m) in CORES]


@pytest.mark.parametrize("module", [m for m, _ in _core_files()])
def test_core_module_imports_only_the_standard_library(module: str) -> None:
    """A pure core module imports the standard library and other cores, nothing else."""
    # mypy_extensions: the compiled cores' class attribute (ADR 0021), a no-op fallback
    # when it is not installed (``core/limit/gradient.py``)
    stdlib = set(sys.stdlib_module_names) | {"__future__", "mypy_extensions"}
    bad = sorted(
        name
        for name, _ in _imports(MODULES[module])
        if name.split(".")[0] not in stdlib and name.split(".")[0] != "ballast_asgi"
    )
    assert not bad, f"{module} imports {bad}: keep it in a driver or an adapter"


def test_every_core_is_checked() -> None:
    """The core list covers real files in every pure package (guards against a renamed tree)."""
    per_core = {unit: sum(1 for m, _ in _core_files() if _unit(m) == unit) for unit in CORES}
    assert all(n >= 2 for n in per_core.values()), per_core


def test_cores_import_nothing_heavy_in_a_fresh_interpreter() -> None:
    """Importing every pure core module, in one fresh interpreter, loads no heavy library."""
    mods = [m for m, _ in _core_files()]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", f"pure cores pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_long_modules_say_why(module: str) -> None:
    """A module over ``MAX_LINES`` lines gives the reason in its docstring."""
    text = MODULES[module].read_text()
    if text.count("\n") <= MAX_LINES or module.removeprefix("ballast_asgi.") in LONG_TODAY:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "Longer than" in doc, f"{module}: {text.count(chr(10))} lines and no reason given"
