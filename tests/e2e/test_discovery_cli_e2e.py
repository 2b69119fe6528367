"""``ballast register`` and ``ballast controller`` as real processes against a real etcd."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ballast_asgi.discovery.core.model import ConfigVersion, Keys
from ballast_asgi.discovery.etcd import Etcd, EtcdUnavailable
from tests.e2e.etcd_server import EtcdServer, etcd_server
from tests.e2e.support import HANG_S, stop_process

pytestmark = pytest.mark.e2e
URL = "http://127.0.0.1:9101"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """One etcd for the module."""
    with etcd_server() as server:
        yield server


def _ballast(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ballast_asgi", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _read(etcd: EtcdServer, key: bytes) -> bytes | None:
    """The key's value; a busy machine may time a connection out, so retry (bounded)."""

    async def get() -> bytes | None:
        client = Etcd([etcd.url], timeout_s=5)
        try:
            for _ in range(5):
                try:
                    kv, _ = await client.get(key)
                    return kv.value if kv else None
                except EtcdUnavailable:
                    continue
            raise AssertionError("etcd did not answer 5 reads in a row")
        finally:
            await client.aclose()

    return asyncio.run(get())


def _wait_for(etcd: EtcdServer, key: bytes, present: bool, proc: subprocess.Popen[bytes]) -> None:
    limit = time.monotonic() + HANG_S
    while (_read(etcd, key) is not None) != present:
        assert proc.poll() is None or not present, proc.communicate()[1].decode()
        assert time.monotonic() < limit, f"{key!r} present={present} not reached"
        time.sleep(0.05)  # condition poll, bounded


def test_register_then_sigterm_deregisters(etcd: EtcdServer) -> None:
    """The instance key exists while `ballast register` runs and is gone after SIGTERM."""
    keys = Keys("cli1")
    proc = _ballast("register", "--etcd", etcd.url, "--service", "cli1", "--url", URL,
                    "--version", "v2", "--ttl", "5")  # fmt: skip
    _wait_for(etcd, keys.instance(URL), True, proc)
    assert json.loads(_read(etcd, keys.instance(URL)) or b"{}") == {"url": URL, "version": "v2"}
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0
    assert _read(etcd, keys.instance(URL)) is None
    events = [json.loads(line)["event"] for line in out.splitlines()]
    assert events[0] == "registered" and events[-1] == "left"


def test_controller_process_writes_a_version(etcd: EtcdServer) -> None:
    """`ballast controller` turns a registration into config version 1."""
    keys = Keys("cli2")
    ctl = _ballast("controller", "--etcd", etcd.url, "--service", "cli2")
    reg = _ballast("register", "--etcd", etcd.url, "--service", "cli2", "--url", URL)
    try:
        _wait_for(etcd, keys.current, True, ctl)
        limit = time.monotonic() + HANG_S
        while not ConfigVersion.decode(_read(etcd, keys.current) or b"").instances:
            assert time.monotonic() < limit, "version with the instance never written"
            time.sleep(0.05)  # condition poll, bounded
    finally:
        codes = (stop_process(reg), stop_process(ctl))  # both stopped, whatever happened
    assert codes == (0, 0)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["register", "--etcd", "https://h:1", "--service", "s", "--url", URL], "--etcd"),
        (["register", "--etcd", "h:1", "--service", "a b", "--url", URL], "service"),
        (["register", "--etcd", "h:1", "--service", "s", "--url", "http://u:p@h:1"], "--url"),
        (["register", "--etcd", "h:1", "--service", "s", "--url", URL, "--ttl", "0"], "--ttl"),
        (["controller", "--etcd", "h:1", "--service", "s", "--debounce-ms", "-1"], "--debounce"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(args: list[str], flag: str) -> None:
    """Malformed flags are refused with exit 2 and a message naming them."""
    proc = _ballast(*args)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 2 and flag in err.decode(), err.decode()
