"""``experiments/_harness/peers.py``: HAProxy and nginx configured as their users protect a backend.

The configuration texts are checked as text and by the binaries themselves
(``haproxy -c``, ``nginx -t``); real processes on loopback in front of the
simulator answer through them, queue by priority (HAProxy), refuse past their
limits (nginx), and stop by PID.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from experiments._harness.peers import (
    Peer,
    fd_limit,
    haproxy_config,
    is_peer,
    max_client_conns,
    nginx_config,
    parse_peer,
    start_peer,
)
from experiments._harness.procs import Procs, processes
from experiments._harness.servers import Target, find_binary, start_sim


def test_peer_names_parse_and_bad_ones_name_the_rule() -> None:
    """``haproxy-64`` and ``nginx-32`` are peers; anything else is refused with the allowed form."""
    assert parse_peer("haproxy-64") == Peer("haproxy", 64)
    assert parse_peer("nginx-32", rate_rps=100.0).rate_rps == 100.0
    assert is_peer("nginx-16") and not is_peer("fixed-16") and not is_peer("haproxy-x")
    with pytest.raises(ValueError, match=r"haproxy-N\[-qMS\]\[-keep\] or nginx-N"):
        parse_peer("envoy-16")
    with pytest.raises(ValueError, match=r"limit must be in 1\.\.100000"):
        Peer("haproxy", 0)
    with pytest.raises(ValueError, match="queue_timeout_s"):
        Peer("haproxy", 16, queue_timeout_s=0)


def test_haproxy_config_queues_per_server_with_priority_classes() -> None:
    """maxconn on the server, critical dequeued first, queue timeout = the shortest deadline."""
    text = haproxy_config(Peer("haproxy", 64), 8080, 9090, fds=20000)
    assert "server s1 127.0.0.1:9090 maxconn 64" in text
    assert "bind 127.0.0.1:8080" in text
    assert "timeout queue 400ms" in text
    assert "\n  option abortonclose" in text
    assert "set-priority-class int(-1) if { req.hdr(X-Priority) -m str critical }" in text
    assert "set-priority-class int(1) if { req.hdr(X-Priority) -m str bulk }" in text
    assert "nbthread 1" in text and "maxconn 9950" in text


def test_haproxy_variants_set_the_queue_timeout_and_abortonclose() -> None:
    """``haproxy-16-q1000-keep``: a 1 s queue timeout and ``no option abortonclose``."""
    peer = parse_peer("haproxy-16-q1000-keep")
    assert peer == Peer("haproxy", 16, queue_timeout_s=1.0, abortonclose=False)
    text = haproxy_config(peer, 8080, 9090)
    assert "timeout queue 1000ms" in text and "no option abortonclose" in text
    assert parse_peer("haproxy-16-q250").queue_timeout_s == 0.25
    assert not is_peer("haproxy-16-x") and not is_peer("nginx-16-q")


def test_nginx_config_limits_non_critical_and_caps_upstream_conns() -> None:
    """max_conns upstream; limit_conn 3/4 of it and limit_req at capacity, both off critical."""
    peer = Peer("nginx", 64, rate_rps=250.0, burst_s=0.2)
    text = nginx_config(peer, 8080, 9090, "/tmp/x", fds=20000)
    assert "server 127.0.0.1:9090 max_conns=64;" in text
    assert 'map $http_x_priority $limited_key { critical ""; default $binary_remote_addr; }' in text
    assert "limit_conn conns 48;" in text
    assert "rate=250r/s" in text and "limit_req zone=rate burst=50 nodelay;" in text
    assert "worker_connections 19900;" in text and "worker_rlimit_nofile 20000;" in text


def test_client_connections_fit_the_open_files_limit() -> None:
    """Half the descriptors less a margin (each client connection may need an upstream one)."""
    assert max_client_conns(20000) == 9950
    assert max_client_conns(50) == 100
    assert fd_limit() >= 1024


@pytest.mark.parametrize("kind", ["haproxy", "nginx"])
def test_the_binary_accepts_its_configuration(kind: str, tmp_path: Path) -> None:
    """``haproxy -c`` / ``nginx -t`` validate the rendered text (the installed versions)."""
    binary = find_binary(kind)
    assert binary is not None, f"{kind} not installed: make system-deps"
    conf = tmp_path / f"{kind}.cfg"
    peer = Peer(kind, 16)
    if kind == "haproxy":
        conf.write_text(haproxy_config(peer, 18080, 19090, fds=fd_limit()))
        cmd = [binary, "-c", "-f", str(conf)]
    else:
        conf.write_text(nginx_config(peer, 18080, 19090, str(tmp_path), fds=fd_limit()))
        cmd = [binary, "-t", "-c", str(conf), "-p", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """A ``Procs`` whose children are stopped by PID at the end."""
    with processes(tmp_path) as p:
        yield p


def _get(target: Target, priority: str) -> httpx.Response:
    return httpx.get(f"{target.base}/", headers={"X-Priority": priority}, timeout=10.0)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["haproxy-16", "nginx-16"])
def test_peer_answers_through_to_the_simulator_and_stops_by_pid(name: str, procs: Procs) -> None:
    """A real peer on loopback forwards one request to the simulator; stopped, its PID is gone."""
    sim = start_sim(procs, None, fast_ms=1.0, slow_ms=1.0)
    peer = start_peer(procs, parse_peer(name), sim.port, None)
    assert peer.pid is not None and peer.name == name
    reply = _get(peer, "critical")
    assert reply.status_code == 200
    assert reply.content == _get(sim, "critical").content
    started = next(p for p in procs.started if p.pid == peer.pid)
    procs.stop(started)
    assert started.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(peer.pid, 0)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["haproxy-16", "nginx-16"])
def test_peer_starts_from_a_relative_work_directory(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out runs/x`` is relative: nginx must not read its -c path against its -p prefix."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    with processes(Path("runs/x")) as procs:
        sim = start_sim(procs, None, fast_ms=1.0, slow_ms=1.0)
        peer = start_peer(procs, parse_peer(name), sim.port, None)
        assert _get(peer, "bulk").status_code == 200


@pytest.mark.e2e
def test_nginx_rate_limits_non_critical_but_never_critical(procs: Procs) -> None:
    """Past limit_req's burst bulk is answered 503 at once; critical is exempt."""
    sim = start_sim(procs, None, fast_ms=1.0, slow_ms=1.0)
    peer = start_peer(procs, Peer("nginx", 16, rate_rps=0.1, burst_s=0.0), sim.port, None)
    bulk = [_get(peer, "bulk").status_code for _ in range(4)]
    critical = [_get(peer, "critical").status_code for _ in range(4)]
    assert bulk[0] == 200 and bulk.count(503) >= 2
    assert critical == [200] * 4


async def _timed(client: httpx.AsyncClient, url: str, priority: str) -> tuple[str, int, float]:
    reply = await client.get(url, headers={"X-Priority": priority})
    return priority, reply.status_code, asyncio.get_running_loop().time()


async def _arrived(client: httpx.AsyncClient, sim: Target, n: int) -> None:
    """Poll (bounded) the simulator's /stats until ``n`` requests have arrived."""
    for _ in range(400):
        if (await client.get(f"{sim.admin}/stats")).json()["arrived"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {n} requests reached the simulator")


async def _behind_one(sim: Target, peer: Target, queued: list[str]) -> list[tuple[str, int, float]]:
    """One bulk request in service at the simulator, then ``queued`` sent at once."""
    limits = httpx.Limits(max_connections=len(queued) + 2)
    async with httpx.AsyncClient(timeout=20.0, limits=limits) as client:
        first = asyncio.create_task(_timed(client, f"{peer.base}/", "bulk"))
        await _arrived(client, sim, 1)
        rest = [asyncio.create_task(_timed(client, f"{peer.base}/", p)) for p in queued]
        return list(await asyncio.gather(first, *rest))


@pytest.mark.e2e
@pytest.mark.slow
def test_haproxy_dequeues_critical_before_older_bulk(procs: Procs) -> None:
    """maxconn 1 over a 1 s backend: with bulk queued, a critical request is served next."""
    sim = start_sim(procs, None, workers=1, fast_ms=1000.0, slow_ms=1000.0)
    peer = start_peer(procs, Peer("haproxy", 1, queue_timeout_s=10.0), sim.port, None)
    done = asyncio.run(_behind_one(sim, peer, ["bulk", "bulk", "critical"]))
    assert all(status == 200 for _, status, _ in done)
    order = [prio for prio, _, _ in sorted(done, key=lambda r: r[2])]
    assert order == ["bulk", "critical", "bulk", "bulk"]


@pytest.mark.e2e
@pytest.mark.slow
def test_haproxy_answers_503_when_the_queue_timeout_passes(procs: Procs) -> None:
    """maxconn 1, queue timeout 200 ms, 1 s backend: the queued request is refused, not served."""
    sim = start_sim(procs, None, workers=1, fast_ms=1000.0, slow_ms=1000.0)
    peer = start_peer(procs, Peer("haproxy", 1, queue_timeout_s=0.2), sim.port, None)
    done = asyncio.run(_behind_one(sim, peer, ["bulk"]))
    assert [status for _, status, _ in done] == [200, 503]
    assert done[1][2] < done[0][2]  # refused at the queue timeout, before the first is served


def test_stop_all_stops_every_child_when_one_stop_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child whose stop times out is reported, and the others are stopped all the same."""
    import sys

    procs = Procs(tmp_path)
    older = procs.start([sys.executable, "-c", "import time; time.sleep(60)"], None, None, "a")
    newer = procs.start([sys.executable, "-c", "import time; time.sleep(60)"], None, None, "b")
    real_stop = Procs.stop

    def stop(self: Procs, proc: subprocess.Popen[bytes]) -> None:
        real_stop(self, proc)
        if proc is newer:  # stopped first (newest first), then its wait "times out"
            raise subprocess.TimeoutExpired(proc.args, 5)

    monkeypatch.setattr(Procs, "stop", stop)
    with pytest.raises(subprocess.TimeoutExpired):
        procs.stop_all()
    assert older.poll() is not None and newer.poll() is not None
