"""Service B: the upstream simulator, plus a record of who was still waiting for its work.

The simulator's own traffic app (FIFO queue, ``workers`` workers, bimodal
service time, ``drop_expired``: a request whose ``X-Deadline-Ms`` passed while
it queued gets 504 without service), wrapped to record for every attempt:
arrival, end, service seconds (the worker's busy time) and when its caller
gave up. The caller's give-up time is the earliest of what B can know:
``X-Deadline-Ms`` (the propagated budget), and the measurement-only headers
``X-Chain-Give-Up`` (epoch seconds: when the end client stops waiting) and
``X-Chain-Attempt-Give-Up`` (when A's attempt times out), which A copies or
sets in every configuration and which nothing but this record reads; the
record also keeps ``X-Chain-Id``, the client request an attempt serves.

``GET /_chain/records`` returns the records (``POST /_chain/reset`` drops
them: after the warm-up); ``POST /_chain/workers?n=N``
resizes the worker pool live (the trigger).

    python -m experiments.chain.service_b --port P [--workers 2 --fast-ms 40 --slow-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import replace
from typing import Any

import uvicorn

from ballast_asgi.core.types import Receive, Scope, Send
from ballast_tools.upstream_sim.app import TrafficApp, Waiter, _deadline_s
from ballast_tools.upstream_sim.model import Profile, Simulator

GIVE_UP = b"x-chain-give-up"
ATTEMPT_GIVE_UP = b"x-chain-attempt-give-up"
DEADLINE = b"x-deadline-ms"


def give_up_at(headers: list[tuple[bytes, bytes]], arrived: float) -> float | None:
    """The earliest give-up time (epoch seconds) the headers reveal, or None."""
    times: list[float] = []
    for name, value in headers:
        try:
            if name == DEADLINE:
                times.append(arrived + float(value) / 1000.0)
            elif name in (GIVE_UP, ATTEMPT_GIVE_UP):
                times.append(float(value))
        except ValueError:
            continue
    return min(times) if times else None


def chain_id(scope: Scope) -> int:
    """The client request an attempt serves (``X-Chain-Id``), -1 when absent."""
    for name, value in scope["headers"]:
        if name == b"x-chain-id":
            try:
                return int(value)
            except ValueError:
                return -1
    return -1


class RecordingB(TrafficApp):
    """The simulator's traffic app with one record per attempt (epoch times)."""

    def __init__(self, sim: Simulator[Waiter]) -> None:
        super().__init__(sim)
        #: [arrived, ended (None: unfinished), busy_s, give_up or None, status, X-Chain-Id or -1]
        self.records: list[list[Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if scope["path"].startswith("/_chain/"):
            await self._control(scope, send)
            return
        arrived, arrived_m = time.time(), time.monotonic()
        record = [arrived, None, 0.0, give_up_at(scope["headers"], arrived), 0, chain_id(scope)]
        self.records.append(record)  # at arrival: an attempt still queued at the end counts
        deadline = _deadline_s(scope, arrived_m)
        await self._wait_for_worker()
        service = self.sim.begin(arrived_m, deadline, time.monotonic())
        try:
            if service.duration_s > 0:
                await asyncio.sleep(service.duration_s)
        except BaseException:
            self.hand_over(self.sim.release())
            raise
        self.hand_over(self.sim.end(service, deadline, time.monotonic()))
        record[1:3] = [time.time(), service.duration_s]
        record[4] = 504 if service.expired else 200
        await self._respond(send, service)

    async def _control(self, scope: Scope, send: Send) -> None:
        if scope["path"] == "/_chain/workers":
            n = int(scope["query_string"].decode().split("=", 1)[1])
            for waiter in self.sim.set_profile(replace(self.sim.profile, workers=n)):
                self.hand_over(waiter)
            body = b"{}"
        elif scope["path"] == "/_chain/reset":
            self.records.clear()
            body = b"{}"
        else:
            body = json.dumps(self.records).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fast-ms", type=float, default=40.0)
    parser.add_argument("--slow-ms", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    profile = Profile(args.workers, args.fast_ms / 1000, args.slow_ms / 1000, drop_expired=True)
    app = RecordingB(Simulator(profile, random.Random(args.seed)))
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                            interface="asgi3", lifespan="off", backlog=4096)  # fmt: skip
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
