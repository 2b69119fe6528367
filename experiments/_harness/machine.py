"""What a report records about the run: the machine, Python and library versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LIBRARIES = ("aiohttp", "uvicorn", "uvloop", "httptools", "httpx", "starlette", "pydantic",
             "matplotlib", "ballast-asgi")  # fmt: skip


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(libraries: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """Python and library versions (``not installed`` for a missing one)."""
    out = {"python": sys.version.split()[0]}
    for lib in libraries:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            out[lib] = "not installed"
    return out


def machine() -> dict[str, Any]:
    """Cores, CPU model, platform, load average and date (UTC) of this run."""
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
