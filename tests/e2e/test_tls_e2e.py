"""TLS with trustme certificates: `ballast --ssl-certfile/--ssl-keyfile`, verified upstreams,
and the handshake under the server's guards (raw sockets: idle, partial ClientHello, past the cap).
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from ballast_asgi.config import build_config
from ballast_asgi.config.models import ServerConfig
from ballast_asgi.gateway import build_gateway
from ballast_asgi.server.serve import uvicorn_settings
from tests.e2e.servers import serving
from tests.e2e.support import (
    NO_BALLAST_ENV,
    free_port,
    no_drain,
    serve_in_thread,
    stop_process,
    stop_thread,
)

pytestmark = pytest.mark.e2e


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers 200 ``hello`` and the scheme it was reached with."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello " + scope["scheme"].encode()})


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway certificate authority."""
    return trustme.CA()


@pytest.fixture
def pems(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(CA pem, server certificate chain pem, server key pem) for 127.0.0.1 and localhost."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    cert.private_key_and_cert_chain_pem.write_to_path(str(paths[1]))
    cert.private_key_pem.write_to_path(str(paths[2]))
    return paths


def test_cli_terminates_tls(pems: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`ballast --ssl-certfile --ssl-keyfile` serves https; a verifying client gets through."""
    ca_pem, cert, key = pems
    up_port, port = free_port(), free_port()
    server, thread = serve_in_thread(hello, up_port)
    args = [sys.executable, "-m", "ballast_asgi", "--upstream", f"http://127.0.0.1:{up_port}",
            "--port", str(port), "--admin-port", "0",
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]  # fmt: skip
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_CONFIG": str(no_drain(tmp_path))}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE)
    verify = ssl.create_default_context(cafile=str(ca_pem))
    try:
        limit = time.monotonic() + 60
        while True:  # bounded readiness poll
            assert proc.poll() is None and time.monotonic() < limit
            try:
                r = httpx.get(f"https://127.0.0.1:{port}/x", verify=verify)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        # the plain-http upstream trusts the gateway's X-Forwarded-Proto: https
        assert r.status_code == 200 and r.text == "hello https"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{port}/x")  # not trusted by the system store
    finally:
        stop_process(proc)
        stop_thread(server, thread)


@pytest.fixture
def https_upstream(pems: tuple[Path, Path, Path]) -> Iterator[str]:
    """The hello app behind TLS on loopback."""
    _, cert, key = pems
    with serving(hello, lifespan="off", ssl_certfile=str(cert), ssl_keyfile=str(key)) as port:
        yield f"https://127.0.0.1:{port}"


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_https_upstream_verified_with_ca_file(
    transport: str, https_upstream: str, pems: tuple[Path, Path, Path]
) -> None:
    """proxy.ca_file trusts the upstream's CA (200); without it verification fails (502)."""
    ca_pem = str(pems[0])
    statuses = []
    for proxy in ({"transport": transport, "ca_file": ca_pem}, {"transport": transport}):
        gw = build_gateway(build_config({"upstream": https_upstream, "proxy": proxy,
                                         "retry": {"enabled": False}}), env={})  # fmt: skip
        with serving(gw) as port:
            r = httpx.get(f"http://127.0.0.1:{port}/x")
            statuses.append((r.status_code, r.text[:5] if r.status_code == 200 else ""))
    assert statuses == [(200, "hello"), (502, "")]


def test_unreadable_tls_files_are_config_errors(tmp_path: Path) -> None:
    """A missing certificate or CA file is one error naming the key."""
    with pytest.raises(Exception, match=r"server\.ssl_certfile"):
        build_config({"upstream": "http://u", "server": {"ssl_certfile": str(tmp_path / "no")}})
    with pytest.raises(Exception, match=r"proxy\.ca_file"):
        build_config({"upstream": "http://u", "proxy": {"ca_file": str(tmp_path / "no")}})


# --- TLS handshakes under the server's guards (issue 27 item 6) ---------------------------

#: The start of a ClientHello that announces 512 bytes and never sends them.
PARTIAL_HELLO = b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + b"\x00" * 10


def _tls_settings(pems: tuple[Path, Path, Path], **server: Any) -> dict[str, Any]:
    """uvicorn settings of the gateway's server section with TLS and ``server`` overrides."""
    _, cert, key = pems
    config = ServerConfig(ssl_certfile=str(cert), ssl_keyfile=str(key), **server)
    return uvicorn_settings(config)


def _closed_within(socks: list[socket.socket], bound_s: float, want: int) -> list[socket.socket]:
    """Wait (at most ``bound_s``) until ``want`` of ``socks`` are closed by the server; those."""
    closed: list[socket.socket] = []
    limit = time.monotonic() + bound_s
    while len(closed) < want:
        left = limit - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([s for s in socks if s not in closed], [], [], left)
        for s in ready:
            try:
                data = s.recv(4096)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                closed.append(s)
    return closed


def _is_open(sock: socket.socket) -> bool:
    """Nothing to read and no FIN/RST pending (the server still holds the connection)."""
    ready, _, _ = select.select([sock], [], [], 0)
    return not ready


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_handshake_is_bounded_by_the_head_timeout(loop: str, pems: tuple[Path, Path, Path]) -> None:
    """Idle sockets and partial ClientHellos are closed after header_timeout_ms, not 60 s."""
    settings = _tls_settings(pems, header_timeout_ms=300)
    with serving(hello, lifespan="off", loop=loop, **settings) as port:
        idle = socket.create_connection(("127.0.0.1", port))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(PARTIAL_HELLO)
        try:
            closed = _closed_within([idle, partial], 20.0, 2)  # generous: the bound is 0.3 s
        finally:
            idle.close()
            partial.close()
    assert len(closed) == 2


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_tls_front_serves_https_with_its_scheme(loop: str, pems: tuple[Path, Path, Path]) -> None:
    """Every fresh connection completes its handshake (verified or refused), keep-alive works.

    Alternating verifying and non-verifying clients on fresh connections: a
    ClientHello that arrived before the TLS layer was installed used to be
    lost on uvloop (the handshake hung until the client's timeout).
    """
    verify = ssl.create_default_context(cafile=str(pems[0]))
    outcomes = []
    with serving(hello, lifespan="off", loop=loop, **_tls_settings(pems)) as port:
        url = f"https://127.0.0.1:{port}/x"
        with httpx.Client(verify=verify, timeout=10) as client:
            outcomes += [client.get(url).text for _ in range(2)]
        for _ in range(10):
            outcomes.append(httpx.get(url, verify=verify, timeout=10).text)
            with pytest.raises(httpx.ConnectError):  # refused by the client, not timed out
                httpx.get(url, timeout=10)
    assert outcomes == ["hello https"] * 12


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_handshakes_past_the_cap_close_the_oldest_and_a_client_is_served(
    loop: str, pems: tuple[Path, Path, Path]
) -> None:
    """Past max_connections the oldest pending handshakes are closed; a real client gets 200."""
    settings = _tls_settings(pems, max_connections=4, header_timeout_ms=60_000)
    verify = ssl.create_default_context(cafile=str(pems[0]))
    with serving(hello, lifespan="off", loop=loop, **settings) as port:
        first = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        second = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        second[-1].sendall(PARTIAL_HELLO)
        try:
            # only the cap can close them: the head timeout is 60 s
            closed = _closed_within(first + second, 20.0, 4)
            with httpx.Client(verify=verify) as client:
                r = client.get(f"https://127.0.0.1:{port}/x")
            still_open = [_is_open(s) for s in second]
        finally:
            for s in first + second:
                s.close()
    assert sorted(map(id, closed)) == sorted(map(id, first))
    assert r.status_code == 200 and r.text == "hello https"
    assert still_open == [False, True, True, True]  # the client's handshake made room too


def test_uvicorn_form_bounds_the_handshake(pems: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`uvicorn ballast_asgi.gateway:app --ssl-certfile`: an idle socket closed at the timeout."""
    ca_pem, cert, key = pems
    up_port, port = free_port(), free_port()
    server, thread = serve_in_thread(hello, up_port)
    config = tmp_path / "ballast.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nserver:\n  header_timeout_ms: 300\n")
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port),
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]  # fmt: skip
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_CONFIG": str(config)}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
    verify = ssl.create_default_context(cafile=str(ca_pem))
    try:
        limit = time.monotonic() + 60
        while True:  # bounded readiness poll
            assert proc.poll() is None and time.monotonic() < limit
            try:
                r = httpx.get(f"https://127.0.0.1:{port}/x", verify=verify)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert r.status_code == 200 and r.text == "hello https"
        idle = socket.create_connection(("127.0.0.1", port))
        try:
            assert len(_closed_within([idle], 20.0, 1)) == 1
        finally:
            idle.close()
    finally:
        stop_process(proc)
        stop_thread(server, thread)
