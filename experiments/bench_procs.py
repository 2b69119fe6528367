"""Processes for ``make bench``: start the backend and each proxy under test, pinned.

Every process is started by ``Procs.start`` (with ``taskset -c CPU``, which
execs into the command, so the Popen pid is the measured process) and stopped
by PID when the ``Procs`` context exits: SIGTERM, wait, SIGKILL if needed.
nginx runs with ``master_process off`` and HAProxy with ``-db`` so that one
process does all the work and its ``/proc/<pid>`` counters are the whole cost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
SBIN = os.environ.get("PATH", "") + ":/usr/sbin:/usr/local/sbin"

_NGINX_HEAD = """
daemon off; master_process off; worker_processes 1; pid {dir}/nginx-{port}.pid;
error_log {dir}/nginx-{port}.err crit;
events {{ worker_connections 16384; }}
http {{ access_log off; client_body_temp_path {dir}; proxy_temp_path {dir};
  fastcgi_temp_path {dir}; uwsgi_temp_path {dir}; scgi_temp_path {dir};
  keepalive_requests 10000000; keepalive_timeout 120s;
"""
NGINX_BACKEND = (
    _NGINX_HEAD
    + """
  server {{ listen {host}:{port} backlog=4096;
    location / {{ root {dir}; try_files /1k.bin =404; }} }} }}
"""
)
NGINX_PROXY = (
    _NGINX_HEAD
    + """
  upstream be {{ server {host}:{up}; keepalive 256; }}
  server {{ listen {host}:{port} backlog=4096;
    location / {{ proxy_pass http://be; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_buffering on; }} }} }}
"""
)
HAPROXY = """
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend f
  bind {host}:{port}
  default_backend b
backend b
  http-reuse always
  server s1 {host}:{up}
"""


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Poll (bounded) until something accepts on ``port``; fail fast if ``proc`` died."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {HOST}:{port} after {timeout_s} s")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            name, *vals = line.split()
            n = [int(v) for v in vals[:8]]
            idle = n[3] + n[4]
            out[int(name[3:])] = (sum(n) - idle, sum(n))
    return out


def busy_share(before: dict[int, tuple[int, int]], cpu: int) -> float:
    """Share of time ``cpu`` was busy (any process) since ``before``."""
    now = cpu_ticks()
    busy = now[cpu][0] - before[cpu][0]
    total = now[cpu][1] - before[cpu][1]
    return busy / total if total else float("nan")


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``, ``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def find_binary(name: str) -> str | None:
    """``name`` on PATH or in /usr/sbin."""
    return shutil.which(name, path=SBIN)


def ensure_package(binary: str, package: str) -> str | None:
    """The binary, installing the Debian package with apt-get when missing and possible."""
    found = find_binary(binary)
    if found or not shutil.which("apt-get"):
        return found
    print(f"bench: {binary} missing; trying apt-get install -y {package}", flush=True)
    try:
        if _apt("install", "-y", package):
            _apt("update")
            _apt("install", "-y", package)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"bench: apt-get failed: {exc}", flush=True)
    return find_binary(binary)


def _apt(*args: str) -> int:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(["apt-get", *args], capture_output=True, env=env, check=False)
    return done.returncode


@dataclass
class Target:
    """One process under test (or the backend itself, ``pid`` None for 'direct')."""

    name: str
    port: int
    pid: int | None
    path: str = "/1k"

    @property
    def url(self) -> str:
        """The URL the generator loads."""
        return f"http://{HOST}:{self.port}{self.path}"


@dataclass
class Procs:
    """Starts pinned processes and stops every one of them by PID."""

    tmp: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, cmd: list[str], cpu: int, port: int, log: str) -> subprocess.Popen[bytes]:
        """Run ``cmd`` pinned to ``cpu`` and wait until it listens on ``port``."""
        # The child keeps its own copy of the descriptor: close ours at once.
        with open(self.tmp / f"{log}.log", "wb") as out:
            proc = subprocess.Popen(
                ["taskset", "-c", str(cpu), *cmd], stdout=out, stderr=subprocess.STDOUT
            )
        self.started.append(proc)
        try:
            wait_port(port, proc)
        except RuntimeError:
            print((self.tmp / f"{log}.log").read_text()[-2000:], file=sys.stderr)
            raise
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM ``proc`` by PID, wait, SIGKILL if it does not exit."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(8)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc in self.started:
            self.started.remove(proc)

    def stop_all(self) -> None:
        """Stop everything still running, newest first."""
        for proc in reversed(list(self.started)):
            self.stop(proc)

    # -- the configurations ---------------------------------------------------
    def nginx_backend(self, cpu: int) -> Target:
        """nginx serving a 1 KB file (the backend and the 'direct' baseline)."""
        nginx = find_binary("nginx")
        if nginx is None:
            raise FileNotFoundError("nginx")
        (self.tmp / "1k.bin").write_bytes(b"x" * 1024)
        port = free_port()
        conf = self.tmp / "backend.conf"
        conf.write_text(NGINX_BACKEND.format(dir=self.tmp, host=HOST, port=port))
        self.start([nginx, "-c", str(conf), "-p", str(self.tmp)], cpu, port, "backend")
        return Target("direct", port, None)

    def asgi_backend(self, cpu: int) -> Target:
        """Fallback backend: a raw-ASGI uvicorn app answering 1 KB."""
        port = free_port()
        cmd = [sys.executable, "-m", "experiments.bench_bare", "backend", "--port", str(port)]
        self.start(cmd, cpu, port, "backend")
        return Target("direct", port, None)

    def nginx_proxy(self, up: int, cpu: int) -> Target:
        """nginx as a reverse proxy (keep-alive upstream pool)."""
        nginx = find_binary("nginx")
        assert nginx is not None
        port = free_port()
        conf = self.tmp / f"proxy-{port}.conf"
        conf.write_text(NGINX_PROXY.format(dir=self.tmp, host=HOST, port=port, up=up))
        proc = self.start([nginx, "-c", str(conf), "-p", str(self.tmp)], cpu, port, "nginx")
        return Target("nginx", port, proc.pid)

    def haproxy(self, haproxy: str, up: int, cpu: int) -> Target:
        """HAProxy in the foreground, one thread, connection reuse."""
        port = free_port()
        conf = self.tmp / "haproxy.cfg"
        conf.write_text(HAPROXY.format(host=HOST, port=port, up=up))
        proc = self.start([haproxy, "-db", "-f", str(conf)], cpu, port, "haproxy")
        return Target("haproxy", port, proc.pid)

    def bare(self, client: str, up: int, cpu: int) -> Target:
        """The bare uvicorn pass-through (raw ASGI) over one httpx or aiohttp client."""
        port = free_port()
        cmd = [sys.executable, "-m", "experiments.bench_bare", "proxy", "--client", client,
               "--upstream", f"http://{HOST}:{up}", "--port", str(port)]  # fmt: skip
        proc = self.start(cmd, cpu, port, f"bare-{client}")
        return Target(f"bare-{client}", port, proc.pid)

    def gateway(self, name: str, upstream: str, cpu: int, config: str, *extra: str) -> Target:
        """The ballast CLI with a YAML config (all four stages on)."""
        port = free_port()
        path = self.tmp / f"{name}.yaml"
        path.write_text(config)
        cmd = [sys.executable, "-m", "ballast_asgi.cli", "--upstream", upstream,
               "--port", str(port), "--admin-port", "0", "--config", str(path), *extra]  # fmt: skip
        proc = self.start(cmd, cpu, port, name)
        return Target(name, port, proc.pid)

    def upstream_sim(self, cpu: int) -> Target:
        """The simulator: 8 workers, 25 ms / 120 ms (about 270 rps)."""
        port, admin = free_port(), free_port()
        cmd = [sys.executable, "-m", "upstream_sim", "--port", str(port),
               "--admin-port", str(admin), "--workers", "8", "--fast", "25ms",
               "--slow", "120ms", "--seed", "1"]  # fmt: skip
        proc = self.start(cmd, cpu, port, "sim")
        return Target("sim", port, proc.pid, path="/")


@contextlib.contextmanager
def processes(tmp: Path) -> Iterator[Procs]:
    """A ``Procs`` whose processes are all stopped by PID on exit (also on errors)."""
    procs = Procs(tmp)
    try:
        yield procs
    finally:
        procs.stop_all()
