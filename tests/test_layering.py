"""Pure cores import no web framework, HTTP client or metrics library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("starlette", "fastapi", "httpx", "uvicorn", "aiohttp", "prometheus_client", "anyio")
CORES = [
    "ballast_asgi/types.py",
    "ballast_asgi/errors.py",
    "ballast_asgi/outcomes.py",
    "ballast_asgi/priority.py",
    "ballast_asgi/classify.py",
    "ballast_asgi/deadline.py",
    "ballast_asgi/context.py",
    "ballast_asgi/limiter.py",
    "ballast_asgi/queue.py",
    "ballast_asgi/breaker.py",
    "ballast_asgi/retry_budget.py",
    "ballast_asgi/limit/*.py",
    "upstream_sim/model.py",
    "loadgen/schedule.py",
    "loadgen/hist.py",
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
