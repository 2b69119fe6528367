"""The ``ballast`` console script.

``ballast --upstream URL --limiter gradient --port 8080 --admin-port 8081``
serves traffic on ``--port`` and ``/metrics`` + ``/snapshot`` at the root of
``--admin-port``, in one process on one event loop. SIGINT/SIGTERM stop both
servers cleanly; SIGHUP reloads the config file (handled by the gateway).

``ballast check-config FILE`` validates a config file and exits non-zero on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn

from ballast_asgi.config import LIMITER_NAMES, load_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.gateway import Gateway, build_gateway


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ballast",
        description="Overload-control gateway. `ballast check-config FILE` validates a config.",
    )
    p.add_argument("--upstream", help="upstream base URL (overrides BALLAST_UPSTREAM)")
    p.add_argument("--limiter", choices=LIMITER_NAMES, help="limit algorithm (default gradient)")
    p.add_argument("--fixed-limit", type=int, help="limit of the fixed limiter")
    p.add_argument("--config", help="YAML config file (overrides BALLAST_CONFIG)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="traffic port (default 8080)")
    p.add_argument(
        "--admin-port", type=int, default=8081, help="admin port, 0 to disable (default 8081)"
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.add_argument("--access-log", action="store_true", help="log every request (slow)")
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.upstream:
        out["upstream"] = args.upstream
    if args.limiter:
        out["limiter.algorithm"] = args.limiter
    if args.fixed_limit is not None:
        out["limiter.fixed_limit"] = args.fixed_limit
    return out


def check_config(path: str) -> int:
    """Validate ``path``; print the result; 0 when valid, 2 otherwise."""
    try:
        load_config(env={"BALLAST_UPSTREAM": "http://placeholder.invalid"}, path=path)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 2
    print(f"ok: {path}")
    return 0


class _Server(uvicorn.Server):
    """A uvicorn server whose signals are handled by ``serve_gateway``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_gateway(gateway: Gateway, host: str, port: int, admin_port: int, **kw: Any) -> None:
    """Serve the gateway (and its admin app) until SIGINT/SIGTERM."""
    servers = [_Server(uvicorn.Config(gateway, host=host, port=port, lifespan="on", **kw))]
    if admin_port:
        admin = uvicorn.Config(
            gateway.admin_app(), host=host, port=admin_port, lifespan="off", **kw
        )
        servers.append(_Server(admin))
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for s in servers:
            s.force_exit = s.should_exit
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    # SIGHUP (config reload) is registered by the gateway itself at lifespan start-up.
    try:
        await asyncio.gather(*(s.serve() for s in servers))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ballast`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check-config"]:
        if len(argv) != 2:
            print("usage: ballast check-config FILE", file=sys.stderr)
            return 2
        return check_config(argv[1])
    if argv[:1] in (["register"], ["controller"]):  # discovery (docs/discovery.md)
        from ballast_asgi.discovery.cli import main as discovery_main

        return discovery_main(argv)
    args = _parser().parse_args(argv)
    try:
        config = load_config(path=args.config, overrides=_overrides(args))
        gateway = build_gateway(config, config_path=args.config)
    except ConfigError as exc:
        print(f"ballast: {exc}", file=sys.stderr)
        return 2
    kw = {
        "log_level": args.log_level,
        "access_log": args.access_log,
        "server_header": False,
        "date_header": False,
    }
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(serve_gateway(gateway, args.host, args.port, args.admin_port, **kw))
    else:
        uvloop.run(serve_gateway(gateway, args.host, args.port, args.admin_port, **kw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
