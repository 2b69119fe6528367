"""``ballast register`` and ``ballast controller``: the discovery processes.

    ballast register --etcd http://127.0.0.1:2379 --service api --url http://127.0.0.1:9101 \\
        [--version v1] [--ttl 5]
    ballast controller --etcd http://127.0.0.1:2379 --service api

``register`` keeps the instance registered (a lease kept alive; registered
again after a lost lease) until SIGINT/SIGTERM, then deregisters and exits 0.
``controller`` writes config versions while elected (gateways run one inside
by default; docs/adr/0004). Both print one JSON line per event on stdout.
Bad arguments exit 2 with a message naming the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Sequence
from typing import Any

from ballast_asgi.discovery.core.model import (
    DiscoveryError,
    Instance,
    Keys,
    check_url,
    check_version,
    parse_endpoint,
)


def _endpoints(text: str) -> list[str]:
    urls = [u.strip() for u in text.split(",") if u.strip()]
    try:
        for url in urls:
            parse_endpoint(url)
    except DiscoveryError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not urls:
        raise argparse.ArgumentTypeError("give at least one etcd URL")
    return urls


def _checked(fn: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            return fn(text)
        except DiscoveryError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _version(text: str) -> str:
    return check_version(text) if text else text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", required=True, type=_endpoints,
                   help="etcd client URL(s), comma-separated (http://HOST:PORT)")  # fmt: skip
    p.add_argument("--service", required=True, help="service name")
    p.add_argument("--prefix", default="/ballast", help="etcd key prefix (default /ballast)")


def _register_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ballast register", description="Register one instance.")
    _common(p)
    p.add_argument("--url", required=True, type=_checked(check_url), help="instance base URL")
    p.add_argument("--version", default="", type=_checked(_version), help="release label (v1)")
    p.add_argument("--ttl", type=int, default=5, help="lease TTL in seconds (default 5, 1..300)")
    return p


def _controller_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ballast controller", description="Write config versions.")
    _common(p)
    p.add_argument("--debounce-ms", type=int, default=50, help="default 50")
    p.add_argument("--max-wait-ms", type=int, default=500, help="default 500")
    p.add_argument("--removal-grace-ms", type=int, default=2000, help="default 2000")
    p.add_argument("--election-ttl", type=int, default=3, help="election lease TTL s (default 3)")
    return p


def _print_event(name: str, fields: dict[str, Any]) -> None:
    print(json.dumps({"event": name, **fields}, sort_keys=True), flush=True)


async def _until_signalled(run: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _register(args: argparse.Namespace) -> None:
    from ballast_asgi.discovery.etcd import Etcd
    from ballast_asgi.discovery.registrar import Registrar

    etcd = Etcd(args.etcd)
    keys = Keys(args.service, args.prefix)
    registrar = Registrar(
        etcd, keys, Instance(args.url, args.version), ttl_s=args.ttl, on_event=_print_event
    )
    try:
        await _until_signalled(registrar.run)
    finally:
        await etcd.aclose()


async def _controller(args: argparse.Namespace) -> None:
    from ballast_asgi.discovery.controller import Controller
    from ballast_asgi.discovery.etcd import Etcd

    etcd = Etcd(args.etcd)
    controller = Controller(
        etcd,
        Keys(args.service, args.prefix),
        debounce_s=args.debounce_ms / 1000,
        max_wait_s=args.max_wait_ms / 1000,
        removal_grace_s=args.removal_grace_ms / 1000,
        lease_ttl_s=args.election_ttl,
        on_event=_print_event,
    )
    try:
        await _until_signalled(controller.run)
    finally:
        await etcd.aclose()


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        Keys(args.service, args.prefix)
    except DiscoveryError as exc:
        parser.error(str(exc))
    for name in ("ttl", "election_ttl"):
        value = getattr(args, name, None)
        if value is not None and not 1 <= value <= 300:
            parser.error(f"--{name.replace('_', '-')}: must be in 1..300 seconds, got {value}")
    for name in ("debounce_ms", "max_wait_ms", "removal_grace_ms"):
        value = getattr(args, name, None)
        if value is not None and not 0 <= value <= 600_000:
            parser.error(f"--{name.replace('_', '-')}: must be in 0..600000, got {value}")
    if getattr(args, "max_wait_ms", 1) < getattr(args, "debounce_ms", 0):
        parser.error("--max-wait-ms: must be >= --debounce-ms")


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with ``register`` or ``controller``; the exit code."""
    command, rest = argv[0], list(argv[1:])
    parser = _register_parser() if command == "register" else _controller_parser()
    args = parser.parse_args(rest)
    _validate(args, parser)
    run = _register if command == "register" else _controller
    import uvloop

    uvloop.run(run(args))
    return 0
