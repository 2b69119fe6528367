"""The ``ballast`` console script.

``ballast --upstream URL --limiter gradient --port 8080 --admin-port 8081``
serves traffic on ``--port`` and ``/metrics`` + ``/snapshot`` at the root of
``--admin-port``, in one process on one event loop. Both sockets are bound
before anything starts (a port in use is one line and exit code 2), then the
addresses are printed. SIGINT/SIGTERM start a graceful drain (``drain``:
health 503 for ``server.drain_grace_ms`` while still serving, then the
listeners close and in-flight and queued requests get
``server.shutdown_timeout_ms``); a second signal stops at once. SIGHUP reloads
the config file (handled by the gateway).

The servers run with the ``server`` config section (``ballast_asgi.server.serve``):
uvicorn's proxy-headers rewrite off, no date/server headers of its own (the
upstream's pass through), a request-head timeout and size cap, a keep-alive
timeout and a connection cap.

``ballast check-config FILE [--connect]`` validates a config file exactly as
start-up would (``ballast_asgi.server.check``) and exits non-zero on error;
``ballast register`` / ``ballast controller`` are discovery's commands
(docs/discovery.md); ``ballast --version`` prints the version. The options and
the config overrides they make are in ``args.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from ballast_asgi.config import load_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.gateway import Gateway, build_gateway, warn_header_trust
from ballast_asgi.server.args import check_parser, config_overrides, traffic_parser
from ballast_asgi.server.check import check
from ballast_asgi.server.check import connect as connect_all
from ballast_asgi.server.serve import QuietServer, uvicorn_settings
from ballast_asgi.server.supervisor import run_workers, share_path
from ballast_asgi.server.workers import scale_config
from ballast_asgi.telemetry.events import FORMATS
from ballast_asgi.telemetry.events import configure as configure_events


def check_config(path: str, connect: bool = False, timeout_s: float = 2.0) -> int:
    """Validate ``path`` as start-up would; with ``connect``, try its dependencies; 0 or 2."""
    try:
        config = check(path)
    except ConfigError as exc:
        print(f"invalid: {redact_userinfo(str(exc))}", file=sys.stderr)
        return 2
    print(f"ok: {path}")
    if not connect:
        return 0
    results = asyncio.run(connect_all(config, timeout_s))
    for ok, line in results:
        print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if all(ok for ok, _ in results) else 2


def bind(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket, or ``ConfigError`` naming the address and the reason."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({what}): {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot listen on {host}:{port} ({what}): {reason.lower()}") from None
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


#: The banner's upstream while discovery has not applied a first version.
WAITING = "waiting for the first discovery version"


def banner(gateway: Gateway, traffic: socket.socket, admin: socket.socket | None) -> str:
    """The start-up line: where traffic and admin are served, and what is proxied."""
    cfg = gateway.config
    scheme = "https" if cfg.server.ssl_certfile else "http"
    upstream = ",".join(redact_userinfo(i.url) for i in cfg.instances) or WAITING
    line = (
        f"ballast: serving {_url(traffic, scheme)} -> {upstream} (limiter {cfg.limiter.algorithm})"
    )
    if admin is not None:
        line += f"; admin {_url(admin, scheme)}/ (metrics, snapshot, health)"
    if cfg.admin.on_traffic_port:
        line += f"; {_url(traffic, scheme)}/_ballast/health"
    return line


async def serve_gateway(
    gateway: Gateway, traffic: socket.socket, admin: socket.socket | None, **kw: Any
) -> None:
    """Serve the gateway (and its admin app) on bound sockets until SIGINT/SIGTERM."""
    gateway.server_may_rewrite = False
    server = gateway.config.server
    base = gateway.server_protocol
    settings = {**uvicorn_settings(server, gateway.config.websocket, base), **kw}
    pairs = [(QuietServer(uvicorn.Config(gateway, lifespan="on", **settings)), traffic)]
    if admin is not None:
        config = uvicorn.Config(gateway.admin_app(), lifespan="off", **settings)
        pairs.append((QuietServer(config), admin))
    loop = asyncio.get_running_loop()
    servers = [s for s, _ in pairs]
    draining: list[asyncio.Task[None]] = []

    def stop() -> None:
        if draining:  # a second signal: stop now
            for s in servers:
                s.force_exit = s.should_exit = True
            return
        draining.append(loop.create_task(drain(gateway, servers)))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    # SIGHUP (config reload) is registered by the gateway itself at lifespan start-up.
    try:
        await asyncio.gather(*(s.serve(sockets=[sock]) for s, sock in pairs))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


async def drain(gateway: Gateway, servers: Sequence[uvicorn.Server]) -> None:
    """Graceful shutdown: health 503 for ``drain_grace_ms`` while serving, then close.

    Load balancers see the 503 and stop sending new connections; requests that
    still come are served. Then uvicorn closes the listeners and gives the
    in-flight and queued requests ``shutdown_timeout_ms`` to finish.
    """
    gateway.draining = True
    grace_s = gateway.config.server.drain_grace_ms / 1000.0
    print(f"ballast: draining: health answers 503; listener closes in {grace_s:g} s",
          file=sys.stderr, flush=True)  # fmt: skip
    await asyncio.sleep(grace_s)
    for s in servers:
        s.should_exit = True


def _start(args: argparse.Namespace) -> tuple[Gateway, socket.socket, socket.socket | None]:
    config = load_config(path=args.config, overrides=config_overrides(args))
    gateway = build_gateway(
        scale_config(config, args.workers),
        config_path=args.config,
        overrides=config_overrides(args),
    )
    gateway.set_worker(0, args.workers)
    traffic = bind(args.host, args.port, "traffic port")
    try:
        admin = bind(args.host, args.admin_port, "admin port") if args.admin_port else None
    except ConfigError:
        traffic.close()
        raise
    return gateway, traffic, admin


def _configure_events(args: argparse.Namespace) -> None:
    """Operator events on stderr: ``--log-format`` or ``BALLAST_LOG_FORMAT``; level INFO
    (state changes and recoveries show at uvicorn's default ``warning``) unless
    ``--log-level`` asks for less."""
    fmt = args.log_format or os.environ.get("BALLAST_LOG_FORMAT") or "text"
    if fmt not in FORMATS:
        raise ConfigError(f"BALLAST_LOG_FORMAT: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    quiet = args.log_level.lower() in ("error", "critical")
    configure_events(fmt, args.log_level if quiet else "info")


def _run(main: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(main)
    else:
        uvloop.run(main)


def _workers(
    args: argparse.Namespace,
    first: Gateway,
    traffic: socket.socket,
    admin: socket.socket | None,
    kw: dict[str, Any],
) -> int:
    """``--workers N``: each worker its own gateway (with 1/N of every cap) on the shared port."""
    base = first.server_protocol
    settings = {**uvicorn_settings(first.config.server, first.config.websocket, base), **kw}

    def run(index: int, traffic: socket.socket, worker_admin: socket.socket) -> None:
        # Built after the fork, from the validated (scaled) config: a forked copy of the
        # parent's gateway would give every worker the same random generators (the same
        # p2c draws, jitter and canary split) and the same rate-limit heartbeat id, so
        # Redis would count N workers as one live gateway.
        gateway = build_gateway(
            first.config, config_path=args.config, overrides=config_overrides(args)
        )
        redivide = first.config.workers.redivide_on_loss
        gateway.set_worker(index, args.workers, share_path(worker_admin) if redivide else None)
        _run(serve_gateway(gateway, traffic, worker_admin, **kw))

    redivide = first.config.workers.redivide_on_loss
    return run_workers(args.workers, traffic, admin, run, settings, redivide=redivide)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ballast`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check-config"]:
        checked = check_parser().parse_args(argv[1:])
        return check_config(checked.file, checked.connect, checked.timeout)
    if argv[:1] in (["register"], ["controller"]):  # discovery (docs/discovery.md)
        from ballast_asgi.discovery.cli import main as discovery_main

        return discovery_main(argv)
    args = traffic_parser().parse_args(argv)
    try:
        _configure_events(args)
        gateway, traffic, admin = _start(args)
    except ConfigError as exc:
        print(f"ballast: {redact_userinfo(str(exc))}", file=sys.stderr)
        return 2
    print(banner(gateway, traffic, admin), file=sys.stderr, flush=True)
    warn_header_trust(gateway.config)
    kw = {"log_level": args.log_level, "access_log": args.access_log}
    if args.workers > 1:
        return _workers(args, gateway, traffic, admin, kw)
    _run(serve_gateway(gateway, traffic, admin, **kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
