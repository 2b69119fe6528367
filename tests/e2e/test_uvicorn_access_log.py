"""``uvicorn ballast_asgi.gateway:app`` with default flags logs no line per request.

uvicorn's access log is on by default and cost about 7 % of the gateway's CPU
per request at saturation (docs/bench.md); the gateway turns it off when uvicorn
loads it, unless ``--access-log`` asks for it explicitly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.support import NO_BALLAST_ENV, free_port, stop_process, wait_http

pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, *flags: str) -> tuple[str, str]:
    """Start the uvicorn form with ``flags``, send two requests, stop it: (stdout, stderr)."""
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({"upstream": "http://127.0.0.1:9"}))
    port = free_port()
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_CONFIG": str(config)}
    env.pop("UVICORN_ACCESS_LOG", None)
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port),
            *flags]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/x/probe").status_code == 502
    finally:
        stop_process(proc)
    out, err = proc.communicate()
    return out.decode(), err.decode()


def test_default_flags_write_no_access_line(tmp_path: Path) -> None:
    """No per-request line on stdout; one note on stderr says how to get it back."""
    out, err = _run(tmp_path)
    assert "/x/probe" not in out
    assert "uvicorn's access log is off for this app" in err


def test_explicit_access_log_flag_is_kept(tmp_path: Path) -> None:
    """``--access-log`` keeps uvicorn's line per request."""
    out, err = _run(tmp_path, "--access-log")
    assert '"GET /x/probe HTTP/1.1" 502' in out
    assert "access log is off" not in err
