"""The churn events of the experiment and what each one measures.

One event per run, two seconds in, cycling through::

    crash -> add -> lease_loss -> none -> deregister -> add -> lease_loss -> none

``add`` starts an idle simulator slot (it registers itself); ``deregister``
SIGTERMs one (it deregisters, then stops serving); ``crash`` SIGKILLs one (no
deregistration: the lease expires after 5 s, the instance leaves the list 2 s
later); ``lease_loss`` revokes a live instance's lease in etcd (its registrar
sees its key deleted and registers the same key and value again); ``none``
is a control run (same load, no churn): what it loses, the machine lost.
At least two instances stay live. Runs other than ``lease_loss`` also flap an
*alias* of a live instance (its URL with a base path, a real instance that
serves): registered, applied, deregistered, removed, for more latency samples.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ballast_asgi.discovery.core.model import ConfigVersion, Instance, Keys
from ballast_asgi.discovery.etcd import Etcd
from ballast_asgi.discovery.registrar import Registrar
from experiments.discovery.stack import SERVICE, TTL_S, Sim

CYCLE = ("crash", "add", "lease_loss", "none", "deregister", "add", "lease_loss", "none")
KEYS = Keys(SERVICE)


@dataclass
class Marks:
    """What happened when, for matching against the versions the gateways applied."""

    #: (url, wall time the registration's put returned)
    registered: list[tuple[str, float]] = field(default_factory=list)
    #: (url, wall time the deregistration started)
    deregistered: list[tuple[str, float]] = field(default_factory=list)
    #: (versions written during a lease-loss run, ...)
    lease_loss_versions: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


async def current_number(etcd: Etcd) -> int:
    """The number of the current config version (0: none)."""
    kv, _ = await etcd.get(KEYS.current)
    return ConfigVersion.decode(kv.value).number if kv else 0


async def revoke_lease_of(etcd: Etcd, url: str) -> bool:
    """Revoke the lease the instance at ``url`` is registered on."""
    kv, _ = await etcd.get(KEYS.instance(url))
    if kv is None or not kv.lease:
        return False
    await etcd.revoke(kv.lease)
    return True


def pick(sims: list[Sim], live: bool, n: int) -> Sim | None:
    """A live (or idle) slot, rotating by ``n``."""
    pool = [s for s in sims if s.live == live]
    return pool[n % len(pool)] if pool else None


async def fire(kind: str, n: int, sims: list[Sim], etcd: Etcd, marks: Marks) -> str:
    """Carry out event ``kind``; returns what was done."""
    marks.counts[kind] = marks.counts.get(kind, 0) + 1
    loop = asyncio.get_running_loop()
    live = [s for s in sims if s.live]
    if kind == "add":
        sim = pick(sims, False, n)
        if sim is None:
            return "add: no idle slot"
        await loop.run_in_executor(None, sim.start)
        await _wait_registered(sim, marks)
        return f"add {sim.url}"
    if kind in ("deregister", "crash"):
        if len(live) <= 2:
            return f"{kind}: skipped (2 live)"
        sim = pick(sims, True, n)
        assert sim is not None
        if kind == "crash":
            sim.crash()
        else:
            marks.deregistered.append((sim.url, time.time()))
            await loop.run_in_executor(None, sim.stop)
        return f"{kind} {sim.url}"
    if kind == "none":
        return "none (control)"
    sim = pick(sims, True, n)
    assert sim is not None
    ok = await revoke_lease_of(etcd, sim.url)
    return f"lease_loss {sim.url} ({'revoked' if ok else 'no lease found'})"


async def _wait_registered(sim: Sim, marks: Marks) -> None:
    loop = asyncio.get_running_loop()
    limit = loop.time() + 10
    while loop.time() < limit:
        at = sim.registered_at()
        if at is not None:
            marks.registered.append((sim.url, at))
            return
        await asyncio.sleep(0.05)


async def flap_alias(etcd_url: str, sim: Sim, n: int, marks: Marks, hold_s: float = 1.0) -> None:
    """Register an alias of ``sim`` (its URL plus a base path), hold, deregister it."""
    url = f"{sim.url}/alias{n}"
    etcd = Etcd([etcd_url])
    stop = asyncio.Event()

    def heard(name: str, fields: dict[str, object]) -> None:
        if name == "registered":
            marks.registered.append((url, float(fields["at"])))  # type: ignore[arg-type]

    registrar = Registrar(etcd, KEYS, Instance(url), ttl_s=TTL_S, on_event=heard)
    task = asyncio.ensure_future(registrar.run(stop))
    await asyncio.sleep(hold_s)
    marks.deregistered.append((url, time.time()))
    stop.set()
    await asyncio.wait_for(task, 5)
    await etcd.aclose()
