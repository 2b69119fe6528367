"""Forwarded headers never decide trust: raw sockets against the CLI and the uvicorn form.

Both forms start with their default flags (no ``--no-proxy-headers``): the
gateway itself turns uvicorn's rewrite off, so ``scope["client"]`` is the direct
TCP peer for ``priority.trusted_networks`` and for the ``X-Forwarded-For`` hop.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.raw import get, header_values, metric, status_of
from tests.e2e.support import (
    NO_BALLAST_ENV,
    free_port,
    serve_in_thread,
    stop_process,
    stop_thread,
    wait_http,
)

pytestmark = pytest.mark.e2e
FORMS = ["cli", "uvicorn", "uvicorn-http"]


class Recorder:
    """An upstream that answers 200 and keeps the headers of every request."""

    def __init__(self) -> None:
        self.seen: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    """A recording upstream on loopback."""
    rec, port = Recorder(), free_port()
    server, thread = serve_in_thread(rec, port)
    yield rec, f"http://127.0.0.1:{port}"
    stop_thread(server, thread)


@contextmanager
def gateway(form: str, config: Path) -> Iterator[int]:
    """The gateway in ``form`` (``cli``, ``uvicorn``, or ``uvicorn-http``: uvicorn with
    ``--http ballast_asgi.server.serve:GatewayProtocol``) with default flags: its port."""
    port = free_port()
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_CONFIG": str(config)}
    if form == "cli":
        args = ["-m", "ballast_asgi", "--port", str(port), "--admin-port", "0"]
    else:
        args = ["-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]
        if form == "uvicorn-http":
            args += ["--http", "ballast_asgi.server.serve:GatewayProtocol"]
    proc = subprocess.Popen([sys.executable, *args], env=env, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        yield port
    finally:
        stop_process(proc)


def _config(tmp_path: Path, upstream: str, networks: list[str]) -> Path:
    path = tmp_path / "gw.yaml"
    # No drain grace: the CLI form ends at SIGTERM at once (test_drain_e2e.py has the drain).
    doc = {"upstream": upstream, "priority": {"trust_header": False,
                                              "trusted_networks": networks},
           "server": {"drain_grace_ms": 0}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def _metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/_ballast/metrics").text


@pytest.mark.parametrize("form", FORMS)
def test_forged_forwarded_for_does_not_make_a_client_trusted(
    form: str, tmp_path: Path, recorder: tuple[Recorder, str]
) -> None:
    """A loopback client claiming 10.1.2.3 in X-Forwarded-For is not in 10.0.0.0/8."""
    rec, upstream = recorder
    with gateway(form, _config(tmp_path, upstream, ["10.0.0.0/8"])) as port:
        forged = {"X-Priority": "critical", "X-Forwarded-For": "10.1.2.3"}
        assert status_of(get(port, "/x", forged)) == 200
        forged_port = {"X-Priority": "critical", "X-Forwarded-For": "10.1.2.3:4444"}
        assert status_of(get(port, "/x", forged_port)) == 200
        text = _metrics(port)
    assert metric(text, "ballast_priority_header_ignored_total") == 2
    assert metric(text, "ballast_requests_total", priority="critical") == 0
    assert rec.seen[0][b"x-forwarded-for"] == b"10.1.2.3, 127.0.0.1"


@pytest.mark.parametrize("form", FORMS)
def test_trusted_local_caller_forwarding_xff_stays_trusted(
    form: str, tmp_path: Path, recorder: tuple[Recorder, str]
) -> None:
    """A caller in 127.0.0.1/32 that forwards its client's XFF keeps its X-Priority."""
    rec, upstream = recorder
    with gateway(form, _config(tmp_path, upstream, ["127.0.0.1/32"])) as port:
        headers = {"X-Priority": "critical", "X-Forwarded-For": "203.0.113.9"}
        response = get(port, "/x", headers)
        text = _metrics(port)
    assert status_of(response) == 200
    assert metric(text, "ballast_requests_total", priority="critical") == 1
    assert metric(text, "ballast_priority_header_ignored_total") == 0
    assert rec.seen[0][b"x-forwarded-for"] == b"203.0.113.9, 127.0.0.1"


@pytest.mark.parametrize("form", FORMS)
def test_one_date_and_one_server_the_upstreams(
    form: str, tmp_path: Path, recorder: tuple[Recorder, str]
) -> None:
    """The server adds no Date/Server of its own: exactly the upstream's reach the client."""
    _, upstream = recorder
    with gateway(form, _config(tmp_path, upstream, [])) as port:
        response = get(port, "/x")
    assert status_of(response) == 200
    assert header_values(response, b"server") == [b"uvicorn"]  # the upstream's (uvicorn too)
    assert len(header_values(response, b"date")) == 1


def test_the_protocol_class_form_caps_the_head(tmp_path: Path) -> None:
    """``--http ...:GatewayProtocol`` takes server.max_header_bytes from the gateway: an
    unfinished 10 KB head gets 431 under a 2 KiB cap (uvicorn's default would wait)."""
    path = tmp_path / "gw.yaml"
    doc = {"upstream": "http://127.0.0.1:9", "server": {"max_header_bytes": 2048}}
    path.write_text(json.dumps(doc))
    with gateway("uvicorn-http", path) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 10_000)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431")
