"""The ``ballast`` command line: its options and the config overrides they make.

``traffic_parser()`` is ``ballast``'s own (serve traffic: upstream, limiter,
ports, TLS files, workers, logging); ``check_parser()`` is ``ballast
check-config``'s; ``port_number`` validates a port for argparse;
``config_overrides(args)`` turns the options into dotted config keys for
``load_config``. What the commands do is ``cli.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ballast_asgi import __version__
from ballast_asgi.config import LIMITER_NAMES
from ballast_asgi.telemetry.events import FORMATS


def traffic_parser() -> argparse.ArgumentParser:
    """The options of ``ballast`` (serve traffic), with the other commands in its epilog."""
    p = argparse.ArgumentParser(
        prog="ballast",
        description="Overload-control gateway: serves --port, proxies to --upstream.",
        epilog="commands:\n"
        "  ballast check-config FILE [--connect]   validate a config as start-up would "
        "(--connect: try upstreams, Redis, etcd)\n"
        "  ballast register --etcd URL --service NAME --url URL [--ttl S]   register an "
        "instance in etcd (docs/discovery.md)\n"
        "  ballast controller --etcd URL --service NAME   run the discovery controller alone\n"
        "  ballast COMMAND --help                   that command's options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"ballast {__version__}")
    p.add_argument("--upstream", help="upstream base URL (overrides BALLAST_UPSTREAM)")
    p.add_argument("--limiter", choices=LIMITER_NAMES, help="limit algorithm (default gradient)")
    p.add_argument("--fixed-limit", type=int, help="limit of the fixed limiter")
    p.add_argument("--config", help="YAML config file (overrides BALLAST_CONFIG)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8080, help="traffic port (default 8080)")
    p.add_argument(
        "--admin-port",
        type=port_number,
        default=8081,
        help="admin port, 0 to disable (default 8081)",
    )
    p.add_argument("--ssl-certfile", help="PEM certificate: serve https (server.ssl_certfile)")
    p.add_argument("--ssl-keyfile", help="PEM private key of --ssl-certfile (server.ssl_keyfile)")
    p.add_argument(
        "--workers", type=int, default=1,
        help="processes sharing the port; every cap is divided between them (default 1)",
    )  # fmt: skip
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.add_argument(
        "--log-format", choices=FORMATS, default=None,
        help="operator events (docs/operations.md): text or json lines on stderr "
        "(default BALLAST_LOG_FORMAT, else text)",
    )  # fmt: skip
    p.add_argument("--access-log", action="store_true", help="log every request (slow)")
    return p


def check_parser() -> argparse.ArgumentParser:
    """The options of ``ballast check-config``."""
    p = argparse.ArgumentParser(
        prog="ballast check-config",
        description="Validate a ballast YAML config file without starting anything. "
        "Exit code 0 when valid, 2 otherwise (the error names the key and the allowed values).",
    )
    p.add_argument("file", help="the YAML config file")
    p.add_argument(
        "--connect", action="store_true",
        help="also try every upstream (TCP/TLS), Redis (PING) and etcd the config names",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=2.0, help="per dependency (default 2 s)")
    return p


def port_number(text: str) -> int:
    """A TCP port for argparse: an integer in 0..65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in 0..65535, got {text!r}") from None
    if not 0 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The dotted config keys the options set (they win over the file and the environment)."""
    out: dict[str, Any] = {}
    if args.upstream:
        out["upstream"] = args.upstream
    if args.limiter:
        out["limiter.algorithm"] = args.limiter
    if args.fixed_limit is not None:
        out["limiter.fixed_limit"] = args.fixed_limit
    if args.ssl_certfile:
        out["server.ssl_certfile"] = args.ssl_certfile
    if args.ssl_keyfile:
        out["server.ssl_keyfile"] = args.ssl_keyfile
    return out
