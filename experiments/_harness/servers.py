"""What the tools start: nginx/HAProxy (config text), the simulator, the gateway, bare proxies.

Each ``start_*`` takes a ``Procs`` (which stops it by PID later) and the CPU to
pin it to (None: not pinned) and returns a ``Target``. nginx runs with
``master_process off`` and HAProxy with ``-db`` so that one process does all
the work and its ``/proc/<pid>`` counters are the whole cost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from experiments._harness.procs import HOST, Procs, free_port

SBIN = os.environ.get("PATH", "") + ":/usr/sbin:/usr/local/sbin"
BODY_1K = b"x" * 1024

_NGINX_HEAD = """
daemon off; master_process off; worker_processes 1; pid {dir}/nginx-{port}.pid;
error_log {dir}/nginx-{port}.err crit;
events {{ worker_connections 16384; }}
http {{ access_log off; client_body_temp_path {dir}; proxy_temp_path {dir};
  fastcgi_temp_path {dir}; uwsgi_temp_path {dir}; scgi_temp_path {dir};
  keepalive_requests 10000000; keepalive_timeout 120s;
"""
#: nginx's global part (one process, no access log, long keep-alive); a server block follows.
NGINX_HEAD = _NGINX_HEAD
NGINX_BACKEND = _NGINX_HEAD + """
  server {{ listen {host}:{port} backlog=4096;
    location / {{ root {dir}; try_files /1k.bin =404; }} }} }}
"""  # fmt: skip
NGINX_PROXY = _NGINX_HEAD + """
  upstream be {{ server {host}:{up}; keepalive 256; }}
  server {{ listen {host}:{port} backlog=4096;
    location / {{ proxy_pass http://be; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_buffering on; }} }} }}
"""  # fmt: skip
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


@dataclass
class Target:
    """One started server (``pid`` None for a process we do not measure)."""

    name: str
    port: int
    pid: int | None
    path: str = "/1k"
    admin_port: int | None = None

    @property
    def url(self) -> str:
        """The URL the generator loads."""
        return f"http://{HOST}:{self.port}{self.path}"

    @property
    def base(self) -> str:
        """``http://host:port`` without a path."""
        return f"http://{HOST}:{self.port}"

    @property
    def admin(self) -> str:
        """``http://host:admin_port`` (the simulator's or the gateway's admin)."""
        return f"http://{HOST}:{self.admin_port}"


def find_binary(name: str) -> str | None:
    """``name`` on PATH or in /usr/sbin."""
    return shutil.which(name, path=SBIN)


def ensure_package(binary: str, package: str) -> str | None:
    """The binary, installing the Debian package with apt-get when missing and possible."""
    found = find_binary(binary)
    if found or not shutil.which("apt-get"):
        return found
    print(f"{binary} missing; trying apt-get install -y {package}", flush=True)
    try:
        if _apt("install", "-y", package):
            _apt("update")
            _apt("install", "-y", package)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"apt-get failed: {exc}", flush=True)
    return find_binary(binary)


def _apt(*args: str) -> int:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(["apt-get", *args], capture_output=True, env=env, check=False)
    return done.returncode


def start_nginx_backend(procs: Procs, cpu: int | None) -> Target:
    """nginx serving a 1 KB file (the backend and the 'direct' baseline); pid not measured."""
    nginx = find_binary("nginx")
    if nginx is None:
        raise FileNotFoundError("nginx")
    (procs.tmp / "1k.bin").write_bytes(BODY_1K)
    port = free_port()
    conf = procs.tmp / f"backend-{port}.conf"
    conf.write_text(NGINX_BACKEND.format(dir=procs.tmp, host=HOST, port=port))
    procs.start([nginx, "-c", str(conf), "-p", str(procs.tmp)], cpu, port, "backend")
    return Target("direct", port, None)


def start_backend(procs: Procs, cpu: int | None) -> tuple[Target, str]:
    """nginx 1 KB when installed (or installable), else the raw-ASGI fallback; and a note."""
    if find_binary("nginx") or ensure_package("nginx", "nginx"):
        return start_nginx_backend(procs, cpu), "backend: nginx serving a 1 KB file"
    port = free_port()
    cmd = [sys.executable, "-m", "experiments.bench.bare", "backend", "--port", str(port)]
    procs.start(cmd, cpu, port, "backend")
    return Target("direct", port, None), "backend: nginx unavailable; raw-ASGI app answering 1 KB"


def start_nginx_proxy(procs: Procs, up: int, cpu: int | None) -> Target:
    """nginx as a reverse proxy (keep-alive upstream pool)."""
    nginx = find_binary("nginx")
    assert nginx is not None
    port = free_port()
    conf = procs.tmp / f"proxy-{port}.conf"
    conf.write_text(NGINX_PROXY.format(dir=procs.tmp, host=HOST, port=port, up=up))
    proc = procs.start([nginx, "-c", str(conf), "-p", str(procs.tmp)], cpu, port, "nginx")
    return Target("nginx", port, proc.pid)


def start_haproxy(procs: Procs, haproxy: str, up: int, cpu: int | None) -> Target:
    """HAProxy in the foreground, one thread, connection reuse."""
    port = free_port()
    conf = procs.tmp / "haproxy.cfg"
    conf.write_text(HAPROXY.format(host=HOST, port=port, up=up))
    proc = procs.start([haproxy, "-db", "-f", str(conf)], cpu, port, "haproxy")
    return Target("haproxy", port, proc.pid)


#: How often a start is retried with fresh ports when the child exits at once
#: (another process on this shared machine took a port between our pick and its bind).
PORT_RETRIES = 3
Command = Callable[[int, int], list[str]]


def start_on_free_ports(
    procs: Procs, make_cmd: Command, cpu: int | None, name: str,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int, int]:  # fmt: skip
    """Start ``make_cmd(port, admin_port)``; on an early exit retry with fresh ports."""
    for attempt in range(PORT_RETRIES):
        port, admin = free_port(), free_port()
        try:
            return procs.start(make_cmd(port, admin), cpu, port, name, env), port, admin
        except RuntimeError:
            if attempt == PORT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def start_bare(procs: Procs, client: str, up: int, cpu: int | None) -> Target:
    """The bare uvicorn pass-through (raw ASGI) over one httpx or aiohttp client."""

    def cmd(port: int, _admin: int) -> list[str]:
        return [sys.executable, "-m", "experiments.bench.bare", "proxy", "--client", client,
                "--upstream", f"http://{HOST}:{up}", "--port", str(port)]  # fmt: skip

    proc, port, _ = start_on_free_ports(procs, cmd, cpu, f"bare-{client}")
    return Target(f"bare-{client}", port, proc.pid)


def sim_cmd(
    port: int, admin: int, *, workers: int = 8, fast_ms: float = 25.0, slow_ms: float = 120.0,
    seed: int = 1, paths: str = "",
) -> list[str]:  # fmt: skip
    """The simulator's command line (``paths``: its ``--paths``, e.g. ``/slow=9x1s``)."""
    return [
        *(sys.executable, "-m", "ballast_tools.upstream_sim", "--host", HOST),
        *("--port", str(port), "--admin-port", str(admin), "--workers", str(workers)),
        *("--fast", f"{fast_ms:g}ms", "--slow", f"{slow_ms:g}ms", "--seed", str(seed)),
        *(("--paths", paths) if paths else ()),
    ]


def start_sim(
    procs: Procs, cpu: int | None, *, name: str = "sim", workers: int = 8,
    fast_ms: float = 25.0, slow_ms: float = 120.0, seed: int = 1, paths: str = "",
) -> Target:  # fmt: skip
    """The simulator (default 8 workers, 25 ms / 120 ms, about 270 rps)."""

    def cmd(port: int, admin: int) -> list[str]:
        return sim_cmd(port, admin, workers=workers, fast_ms=fast_ms, slow_ms=slow_ms, seed=seed,
                       paths=paths)  # fmt: skip

    proc, port, admin = start_on_free_ports(procs, cmd, cpu, name)
    return Target(name, port, proc.pid, path="/", admin_port=admin)


def start_gateway(
    procs: Procs, name: str, upstream: str, cpu: int | None, config: str | None = None,
    *extra: str,
) -> Target:  # fmt: skip
    """The ``ballast`` CLI (with a YAML ``config`` text when given) and its admin port."""
    files: list[str] = []
    if config is not None:
        path = procs.tmp / f"{name}.yaml"
        path.write_text(config)
        files = ["--config", str(path)]

    def cmd(port: int, admin: int) -> list[str]:
        return [sys.executable, "-m", "ballast_asgi", "--upstream", upstream, "--host", HOST,
                "--port", str(port), "--admin-port", str(admin), *files, *extra]  # fmt: skip

    proc, port, admin = start_on_free_ports(procs, cmd, cpu, name)
    return Target(name, port, proc.pid, admin_port=admin)


def start_uvicorn_gateway(
    procs: Procs, name: str, upstream: str, cpu: int | None, env: dict[str, str] | None = None
) -> Target:
    """The gateway exactly as a user starts it: ``uvicorn ballast_asgi.gateway:app``
    (``env``: more environment, e.g. ``BALLAST_CONFIG``)."""
    uvicorn = os.path.join(os.path.dirname(sys.executable), "uvicorn")

    def cmd(port: int, _admin: int) -> list[str]:
        return [uvicorn, "ballast_asgi.gateway:app", "--host", HOST, "--port", str(port)]

    env = {"BALLAST_UPSTREAM": upstream, **(env or {})}
    proc, port, _ = start_on_free_ports(procs, cmd, cpu, name, env)
    return Target(name, port, proc.pid)
