"""Run the simulator's traffic and admin apps: two uvicorn servers on one event loop.

``start_sim`` binds both sockets first (port 0 picks a free port), so callers
(tests, the demo, the experiment) learn the real ports without races, then
starts the servers as tasks on the running loop and returns once both accept
connections. ``RunningSim.stop`` shuts both down gracefully; requests still
in service after ``grace_s`` are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from ballast_tools.upstream_sim.app import TrafficApp, build_admin_app
from ballast_tools.upstream_sim.model import Profile, Simulator

STARTUP_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 = any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _config(app: Any, grace_s: float, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http="httptools",
        loop="none",
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(grace_s) or 1,
        backlog=2048,
    )


@dataclass
class RunningSim:
    """A simulator serving on two loopback ports."""

    sim: Simulator[asyncio.Future[None]]
    traffic: TrafficApp
    host: str
    port: int
    admin_port: int
    servers: list[uvicorn.Server] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Base URL of the traffic port."""
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        """Base URL of the admin port."""
        return f"http://{self.host}:{self.admin_port}"

    async def stop(self) -> None:
        """Stop both servers and wait for them."""
        for server in self.servers:
            server.should_exit = True
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def start_sim(
    profile: Profile,
    *,
    seed: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    admin_port: int = 0,
    grace_s: float = 2.0,
    log_level: str = "warning",
) -> RunningSim:
    """Start the simulator on the running loop; returns when both ports serve."""
    sim: Simulator[asyncio.Future[None]] = Simulator(profile, random.Random(seed))
    traffic = TrafficApp(sim)
    apps = [traffic, build_admin_app(traffic)]
    socks = [bind_socket(host, port), bind_socket(host, admin_port)]
    running = RunningSim(sim, traffic, host, socks[0].getsockname()[1], socks[1].getsockname()[1])
    for app, sock in zip(apps, socks, strict=True):
        server = _Server(_config(app, grace_s, log_level))
        running.servers.append(server)
        running.tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
    await _wait_started(running)
    return running


async def _wait_started(running: RunningSim) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + STARTUP_TIMEOUT_S
    while not all(s.started for s in running.servers):
        failed = [t for t in running.tasks if t.done()]
        if failed or loop.time() > give_up:
            await running.stop()
            raise RuntimeError("upstream_sim failed to start")
        await asyncio.sleep(0.005)
