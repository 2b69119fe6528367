"""Pure cores import no web framework, HTTP client or metrics library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("starlette", "fastapi", "httpx", "uvicorn", "aiohttp", "prometheus_client", "anyio")
CORES = [
    "ballast_asgi/core/*.py",
    "ballast_asgi/core/limit/*.py",
    "ballast_tools/upstream_sim/model.py",
    "ballast_tools/loadgen/schedule.py",
    "ballast_tools/units.py",
    "ballast_tools/hist.py",
    *(f"ballast_asgi/canary/{m}.py" for m in ("evidence", "blocks", "judges", "rollout", "split")),
    *(f"ballast_asgi/client/{m}.py" for m in ("config", "hosts", "live", "policy", "throttle")),
]


def _core_files() -> list[Path]:
    files: list[Path] = []
    for pattern in CORES:
        files.extend(sorted(ROOT.glob(pattern)))
    return files


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_is_pure(path: Path) -> None:
    """A core module imports none of the adapter libraries."""
    bad = _imports(path).intersection(FORBIDDEN)
    assert not bad, f"{path.name} imports {sorted(bad)}: keep it in an adapter"


def test_core_list_is_not_empty() -> None:
    """The layering test checks real files (guards against a renamed tree)."""
    assert len(_core_files()) >= 6


HEAVY = (
    "starlette",
    "httpx",
    "aiohttp",
    "prometheus_client",
    "pydantic",
    "yaml",
    "uvicorn",
    "anyio",
)


def _core_modules() -> list[str]:
    mods = []
    for path in sorted((ROOT / "ballast_asgi" / "core").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods.append(".".join(parts))
    return mods


@pytest.mark.parametrize("module", _core_modules())
def test_core_import_loads_nothing_heavy(module: str) -> None:
    """Importing a core module in a fresh interpreter loads no adapter library."""
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", f"{module} pulled in {out.stdout.strip()}"
