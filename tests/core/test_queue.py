"""The pure priority queue: order, LIFO tail, displacement, reservation, expiry, dispatch."""

from __future__ import annotations

import pytest

from ballast_asgi.core.limit import FixedLimit
from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import PriorityQueue, Waiter, dispatch

C, S, B = Priority.CRITICAL, Priority.STANDARD, Priority.BULK


def w(priority: Priority, t: float, deadline: float | None = None, name: str = "") -> Waiter:
    return Waiter(priority, t, deadline, None, handle=name or f"{priority.label}@{t}")


def drain(q: PriorityQueue) -> list[str]:
    out = []
    while (x := q.pop_best()) is not None:
        out.append(x.handle)
    return out


def test_higher_tier_served_first() -> None:
    """Critical beats standard beats bulk regardless of arrival order."""
    q = PriorityQueue(max_size=10, per_priority=False)
    for waiter in (w(B, 0), w(S, 1), w(C, 2)):
        q.push(waiter)
    assert drain(q) == ["critical@2", "standard@1", "bulk@0"]


def test_fifo_at_or_below_threshold() -> None:
    """A tier at or below lifo_threshold is served oldest first."""
    q = PriorityQueue(max_size=10, lifo_threshold=3)
    for t in range(3):
        q.push(w(C, t))
    assert drain(q) == ["critical@0", "critical@1", "critical@2"]


def test_lifo_above_threshold_then_back_to_fifo() -> None:
    """Above lifo_threshold the newest is served first; at the threshold FIFO resumes."""
    q = PriorityQueue(max_size=10, lifo_threshold=2)
    for t in range(4):
        q.push(w(C, t))
    assert [q.pop_best().handle for _ in range(2)] == ["critical@3", "critical@2"]  # type: ignore[union-attr]
    assert drain(q) == ["critical@0", "critical@1"]


def test_full_queue_displaces_oldest_of_lowest_tier() -> None:
    """A newcomer into a full queue displaces the oldest waiter of the lowest lower tier."""
    q = PriorityQueue(max_size=3, per_priority=False)
    for waiter in (w(S, 0), w(B, 1), w(B, 2)):
        q.push(waiter)
    result = q.push(w(C, 3))
    assert result.accepted and result.displaced is not None
    assert result.displaced.handle == "bulk@1"
    result = q.push(w(S, 4))
    assert result.accepted and result.displaced is not None
    assert result.displaced.handle == "bulk@2"
    assert q.depth(B) == 0 and q.total == 3


def test_newcomer_with_nothing_lower_is_refused() -> None:
    """A newcomer that finds only equal or higher tiers is refused."""
    q = PriorityQueue(max_size=2, per_priority=False)
    q.push(w(S, 0))
    q.push(w(C, 1))
    result = q.push(w(S, 2))
    assert not result.accepted and result.displaced is None
    assert q.total == 2


def test_reservation_keeps_room_for_critical() -> None:
    """Non-critical tiers fill only (1 - reserved_fraction) of the queue; critical uses all."""
    q = PriorityQueue(max_size=4, reserved_fraction=0.5)
    assert q.push(w(B, 0)).accepted and q.push(w(S, 1)).accepted
    assert not q.push(w(B, 2)).accepted
    standard = q.push(w(S, 3))
    assert standard.accepted and standard.displaced is not None  # displaced bulk@0
    assert q.push(w(C, 4)).accepted and q.push(w(C, 5)).accepted
    assert q.total == 4
    assert q.push(w(C, 6)).accepted  # full: critical displaces a standard
    assert q.depth(C) == 3


def test_remove_for_disconnect() -> None:
    """A removed waiter is never served and the depth drops."""
    q = PriorityQueue(max_size=10)
    a, b = w(S, 0), w(S, 1)
    q.push(a)
    q.push(b)
    assert q.remove(a)
    assert not q.remove(a)
    assert drain(q) == ["standard@1"]


def test_expiry_prefers_the_earlier_of_deadline_and_timeout() -> None:
    """Waiter.expiry names the earlier bound and its reason."""
    assert Waiter(S, 0.0, 2.0, 1.0).expiry() == (1.0, ShedReason.QUEUE_TIMEOUT)
    assert Waiter(S, 0.0, 0.5, 1.0).expiry() == (0.5, ShedReason.DEADLINE)
    assert Waiter(S, 0.0, None, None).expiry() is None


def test_expire_removes_due_waiters_with_reasons() -> None:
    """expire(now) sheds exactly the waiters whose deadline or timeout has passed."""
    q = PriorityQueue(max_size=10)
    q.push(Waiter(S, 0.0, 1.0, None, handle="d1"))
    q.push(Waiter(S, 0.0, None, 0.5, handle="t05"))
    q.push(Waiter(B, 0.0, 9.0, None, handle="d9"))
    due = q.expire(1.0)
    assert sorted((x.handle, r) for x, r in due) == [
        ("d1", ShedReason.DEADLINE),
        ("t05", ShedReason.QUEUE_TIMEOUT),
    ]
    assert drain(q) == ["d9"]


def test_ahead_of_accounts_for_the_lifo_tail() -> None:
    """A newcomer waits behind higher tiers, and behind its own tier only below the threshold."""
    q = PriorityQueue(max_size=100, lifo_threshold=2)
    q.push(w(C, 0))
    q.push(w(S, 1))
    assert q.ahead_of(S) == 2
    q.push(w(S, 2))
    assert q.ahead_of(S) == 1  # the newcomer would be served first (LIFO)
    assert q.ahead_of(C) == 1


def test_snapshot_depths() -> None:
    """The snapshot shows depth per tier and the total."""
    q = PriorityQueue(max_size=10)
    q.push(w(B, 0))
    snap = q.snapshot()
    assert snap["depth"] == {"critical": 0, "standard": 0, "bulk": 1}
    assert snap["total"] == 1


class Slot:
    """A fake waiter handle: accepts a permit unless it is gone."""

    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.permit: Permit | None = None


def deliver(waiter: Waiter, permit: Permit) -> bool:
    slot: Slot = waiter.handle
    if slot.gone or slot.permit is not None:
        return False
    slot.permit = permit
    return True


def release_all(slots: list[Slot], now: float) -> None:
    for slot in slots:
        if slot.permit is not None and not slot.permit.released:
            slot.permit.release(Outcome.SUCCESS, now)


def test_dispatch_grants_free_permits_in_order() -> None:
    """dispatch hands each free permit to the best waiter and stops at the limit."""
    lim = Limiter(FixedLimit(2))
    q = PriorityQueue(max_size=10)
    slots = [Slot() for _ in range(3)]
    q.push(Waiter(B, 0.0, handle=slots[0]))
    q.push(Waiter(C, 1.0, handle=slots[1]))
    q.push(Waiter(S, 2.0, handle=slots[2]))
    assert dispatch(q, lim, 3.0, deliver) == 2
    assert slots[1].permit is not None and slots[2].permit is not None
    assert slots[0].permit is None and q.total == 1
    release_all(slots, 4.0)
    assert dispatch(q, lim, 4.0, deliver) == 1
    release_all(slots, 5.0)


def test_grant_timeout_race_passes_the_permit_on() -> None:
    """A permit reaching a waiter that just timed out goes to the next waiter."""
    lim = Limiter(FixedLimit(1))
    q = PriorityQueue(max_size=10)
    gone, alive = Slot(gone=True), Slot()
    q.push(Waiter(C, 0.0, handle=gone))
    q.push(Waiter(C, 1.0, handle=alive))
    assert dispatch(q, lim, 2.0, deliver) == 1
    assert alive.permit is not None and lim.inflight == 1
    release_all([alive], 3.0)


def test_permit_nobody_takes_is_released() -> None:
    """When every waiter is gone the permit is released, not leaked."""
    lim = Limiter(FixedLimit(1))
    q = PriorityQueue(max_size=10)
    q.push(Waiter(S, 0.0, handle=Slot(gone=True)))
    assert dispatch(q, lim, 1.0, deliver) == 0
    assert lim.inflight == 0 and q.total == 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"max_size": 0}, "max_size"), ({"lifo_threshold": -1}, "lifo_threshold"),
     ({"reserved_fraction": 1.5}, "reserved_fraction")],
)  # fmt: skip
def test_rejects_bad_parameters(kw: dict[str, float], field: str) -> None:
    """Invalid parameters raise ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        PriorityQueue(**kw)  # type: ignore[arg-type]


def test_reconfigure_applies_to_later_pushes_only() -> None:
    """A smaller queue keeps its waiters but refuses newcomers beyond the new bound."""
    q = PriorityQueue(max_size=4, per_priority=False)
    for t in range(3):
        q.push(w(S, t))
    q.reconfigure(max_size=2, lifo_threshold=16, per_priority=False, reserved_fraction=0.5)
    assert q.total == 3
    assert not q.push(w(S, 9)).accepted


def test_partitioned_dispatch_with_one_route_waiting_serves_in_queue_order() -> None:
    """One route waiting: its route's free permits go to the waiters in pop_best's order."""
    lim = Limiter(FixedLimit(100), partition=lambda quiet: FixedLimit(3))
    queued, expected = PriorityQueue(max_size=50, lifo_threshold=2), PriorityQueue(max_size=50)
    expected.reconfigure(max_size=50, lifo_threshold=2, per_priority=True, reserved_fraction=0.5)
    slots = [Slot() for _ in range(6)]
    for i, slot in enumerate(slots):
        tier = C if i == 4 else S
        queued.push(Waiter(tier, float(i), handle=slot, route="/a"))
        expected.push(Waiter(tier, float(i), handle=slot, route="/a"))
    order = [waiter.handle for waiter in iter(expected.pop_best, None)][:3]
    served: list[Slot] = []

    def record(waiter: Waiter, permit: Permit) -> bool:
        served.append(waiter.handle)
        return deliver(waiter, permit)

    assert dispatch(queued, lim, 10.0, record) == 3
    assert served == order and order[0] is slots[4]
    assert queued.total == 3 and lim.inflight == 3
    assert all(slot.permit is not None and slot.permit.route == "/a" for slot in served)
    release_all(slots, 11.0)
