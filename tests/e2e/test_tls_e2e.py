"""TLS with trustme certificates: `ballast --ssl-certfile/--ssl-keyfile`, verified upstreams."""

from __future__ import annotations

import os
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
from ballast_asgi.gateway import build_gateway
from tests.e2e.servers import serving
from tests.e2e.support import NO_BALLAST_ENV, free_port, serve_in_thread, stop_process, stop_thread

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


def test_cli_terminates_tls(pems: tuple[Path, Path, Path]) -> None:
    """`ballast --ssl-certfile --ssl-keyfile` serves https; a verifying client gets through."""
    ca_pem, cert, key = pems
    up_port, port = free_port(), free_port()
    server, thread = serve_in_thread(hello, up_port)
    args = [sys.executable, "-m", "ballast_asgi.cli", "--upstream", f"http://127.0.0.1:{up_port}",
            "--port", str(port), "--admin-port", "0",
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]  # fmt: skip
    proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=subprocess.PIPE)
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
