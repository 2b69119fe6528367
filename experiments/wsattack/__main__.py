"""Websocket attacks on a real ``ballast`` gateway, bounded in time (issue 27 items 3-4).

``python -m experiments.wsattack [--flood-s 6] [--message-mib 16] [--watch-s 45]``

1. **Flood**: one websocket to an echo upstream sends tiny frames as fast as a
   raw socket can (and reads the echoes) for ``--flood-s`` seconds while
   ``/_ballast/health`` is fetched every 50 ms; prints health latency before
   and during, and the frames the gateway took per second.
2. **Stalled upstream, client gone**: two websockets to an upstream that stopped
   reading each send ``--message-mib`` MiB messages for ``--send-s`` seconds
   (as far as the gateway takes them), then drop TCP with a reset. The gateway's
   RSS and its open websocket count are sampled every second for ``--watch-s``.

Every process is started here and stopped by PID; the gateway on CPU 0, the
upstream and this driver on CPU 1 (when pinning is possible). ``--config``
adds YAML to the gateway's config (e.g. ``websocket: {send_timeout_ms: 5000}``).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from experiments._harness.cpu import can_pin, pin_self, status_kb
from experiments._harness.procs import HOST, free_port, processes
from experiments._harness.servers import Target, start_gateway
from experiments._harness.stats import percentile

_ZERO_MASK = b"\x00\x00\x00\x00"  # a valid masking key that leaves the payload as is


def frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One masked client frame (FIN set) carrying ``payload``."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + _ZERO_MASK + payload


def handshake(port: int, path: str) -> socket.socket:
    """A raw socket with a completed websocket upgrade (raises on a refusal)."""
    sock = socket.create_connection((HOST, port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError(f"upgrade closed: {head!r}")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        status = head.split(b"\r\n", 1)[0]
        raise RuntimeError(f"upgrade refused: {status!r}")
    return sock


def reset(sock: socket.socket) -> None:
    """Drop the connection with a TCP reset (no close frame, no FIN)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def health_ms(port: int) -> float:
    """Milliseconds for one ``GET /_ballast/health`` on a fresh connection (10 s cap)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        conn.request("GET", "/_ballast/health")
        conn.getresponse().read()
    except OSError:
        return 10_000.0
    finally:
        conn.close()
    return (time.perf_counter() - start) * 1000


def probe(port: int, seconds: float) -> list[float]:
    """Health latencies every 50 ms for ``seconds``."""
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(health_ms(port))
        time.sleep(0.05)  # a probe interval, not a wait for correctness
    return out


def summary(values: list[float]) -> str:
    """p50 / p99 / max of health latencies."""
    if not values:
        return "no samples"
    return (f"p50 {percentile(values, 50):.1f} ms, p99 {percentile(values, 99):.1f} ms, "
            f"max {max(values):.1f} ms (n={len(values)})")  # fmt: skip


def flood(gw: Target, seconds: float, opcode: int = 0x1) -> None:
    """One socket floods tiny frames at the echo upstream while health is probed."""
    print(f"health before: {summary(probe(gw.port, 2.0))}")
    sock = handshake(gw.port, "/echo")
    batch = frame(b"x", opcode) * 8192
    stop = threading.Event()
    sent = [0]
    got = [0]

    def writer() -> None:
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                sent[0] += sock.send(batch)
            except TimeoutError:
                continue
            except OSError:
                return

    def reader() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            got[0] += len(data)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    start = time.monotonic()
    during = probe(gw.port, seconds)
    elapsed = time.monotonic() - start
    stop.set()
    for t in threads:
        t.join(5)
    reset(sock)
    frames = sent[0] // len(frame(b"x"))
    echoed = got[0] // 3  # an unmasked one-byte server frame (or pong) is 3 bytes
    print(f"flood {elapsed:.1f} s: the client wrote {frames / elapsed:,.0f} frames/s (socket "
          f"buffers included), {echoed / elapsed:,.0f} echoed frames/s came back")  # fmt: skip
    print(f"health during flood: {summary(during)}")
    print(f"health after: {summary(probe(gw.port, 1.0))}")


def open_websockets(gw: Target) -> int:
    """The gateway's open websocket connections (``ballast_websocket_connections``)."""
    conn = http.client.HTTPConnection(HOST, gw.port, timeout=10)
    try:
        conn.request("GET", "/_ballast/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith("ballast_websocket_connections "):
            return int(float(line.split()[1]))
    return -1


def websocket_snapshot(gw: Target) -> str:
    """The snapshot's ``websocket`` section (peak bytes held by relays), when it has one."""
    conn = http.client.HTTPConnection(HOST, gw.port, timeout=10)
    try:
        conn.request("GET", "/_ballast/snapshot")
        doc = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    ws = doc.get("websocket")
    if ws is None:
        return "snapshot has no websocket section (before issue 27)"
    return (f"relays held at most {ws['peak_buffered_bytes'] / 1024:.0f} KiB; now "
            f"{ws['buffered_bytes']} bytes, {ws['open']} open")  # fmt: skip


def stalled(gw: Target, mib: float, send_s: float, watch_s: float, clients: int) -> None:
    """Clients send big messages to an upstream that stopped reading, then reset TCP."""
    assert gw.pid is not None
    rss0 = status_kb(gw.pid, "VmRSS")
    message = frame(b"\x00" * int(mib * 1024 * 1024))
    sent = [0] * clients

    def client(index: int) -> None:
        try:
            sock = handshake(gw.port, "/stall")
        except (OSError, RuntimeError) as exc:
            print(f"client {index}: {exc}")
            return
        sock.settimeout(1.0)
        end = time.monotonic() + send_s
        view = memoryview(message)
        offset = 0
        while time.monotonic() < end:
            try:
                offset += sock.send(view[offset:])
            except TimeoutError:
                continue  # the gateway stopped reading; keep pushing until send_s
            except OSError:
                break
            if offset == len(message):
                sent[index] += 1
                offset = 0
        reset(sock)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(send_s + 15)
    print(f"{clients} clients sent {sent} whole {mib:g} MiB messages in {send_s:g} s, then reset")
    start = time.monotonic()
    peak = rss0
    freed_at = None
    samples = []
    while time.monotonic() - start < watch_s:
        rss = status_kb(gw.pid, "VmRSS")
        peak = max(peak, rss)
        n_open = open_websockets(gw)
        samples.append((time.monotonic() - start, n_open, rss))
        if n_open == 0 and freed_at is None:
            freed_at = time.monotonic() - start
        time.sleep(1.0)  # a sampling interval
    for at, n_open, rss in samples[:: max(1, len(samples) // 10)]:
        print(f"  t+{at:5.1f} s: open websockets {n_open}, RSS {(rss - rss0) / 1024:+.0f} MiB")
    last = samples[-1]
    print(websocket_snapshot(gw))
    freed = "never" if freed_at is None else f"{freed_at:.0f} s"
    print(f"RSS before {rss0 / 1024:.0f} MiB, peak {(peak - rss0) / 1024:+.0f} MiB, "
          f"after {watch_s:g} s {(last[2] - rss0) / 1024:+.0f} MiB; open websockets "
          f"{last[1]}; slots free after {freed}")  # fmt: skip


def main() -> int:
    """Run both attacks against a fresh gateway and upstream."""
    parser = argparse.ArgumentParser(prog="python -m experiments.wsattack")
    parser.add_argument("--flood-s", type=float, default=6.0)
    parser.add_argument("--message-mib", type=float, default=16.0)
    parser.add_argument("--send-s", type=float, default=5.0)
    parser.add_argument("--watch-s", type=float, default=45.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--config", default="", help="YAML text added to the gateway config")
    parser.add_argument("--only", choices=("flood", "stall"), default=None)
    parser.add_argument("--ping", action="store_true", help="flood ping frames, not text")
    args = parser.parse_args()
    pin = can_pin()
    if pin:
        pin_self(1)
    with processes(Path(tempfile.mkdtemp(prefix="wsattack-"))) as procs:
        up = free_port()
        cmd = [sys.executable, "-m", "uvicorn", "experiments.wsattack.upstream:app",
               "--host", HOST, "--port", str(up), "--log-level", "warning"]  # fmt: skip
        procs.start(cmd, 1 if pin else None, up, "upstream")
        config = "admin:\n  on_traffic_port: true\n" + args.config
        gw = start_gateway(procs, "gw", f"http://{HOST}:{up}", 0 if pin else None, config)
        if args.only in (None, "flood"):
            flood(gw, args.flood_s, 0x9 if args.ping else 0x1)
        if args.only in (None, "stall"):
            stalled(gw, args.message_mib, args.send_s, args.watch_s, args.clients)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
