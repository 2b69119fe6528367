"""One call's leave from a ``Breaker``, settled exactly once.

``Breaker.acquire`` hands out a ``Ticket``; the caller reports the call's
result with ``record(success, now, client=, shared=)`` or frees the slot with
``cancel()`` when the call was not made. A ticket remembers the breaker's
generation (state changes start a new one, so a late result of an earlier
state is ignored) and whether it is the half-open probe. Settling twice is a
bug and raises. The state machine is ``core/breaker.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ballast_asgi.core.breaker import Breaker


class Ticket:
    """Leave to make one upstream call; settle it exactly once."""

    __slots__ = ("_breaker", "_settled", "client", "generation", "probe")

    def __init__(
        self, breaker: Breaker, generation: int, probe: bool, client: str | None = None
    ) -> None:
        self._breaker = breaker
        self.generation = generation
        #: True when this ticket is the half-open probe.
        self.probe = probe
        #: The caller's address, when it was given to ``acquire``.
        self.client = client
        self._settled = False

    @property
    def settled(self) -> bool:
        """Whether ``record`` or ``cancel`` has been called."""
        return self._settled

    def record(
        self, success: bool, now: float, *, client: str | None = None, shared: bool = False
    ) -> None:
        """Report the call's result (exactly once).

        ``client``: the caller's address; ``shared``: a failure that does not
        depend on the request (connect error), counted whoever sent it.
        """
        if self._settled:  # ``_settle``, inlined: every request settles one ticket
            raise RuntimeError("breaker ticket settled twice")
        self._settled = True
        self._breaker._on_result(self, success, now, client, shared)

    def cancel(self) -> None:
        """The call was not made or its result means nothing: free the slot, record nothing."""
        self._settle()
        self._breaker._on_cancel(self)

    def _settle(self) -> None:
        if self._settled:
            raise RuntimeError("breaker ticket settled twice")
        self._settled = True
