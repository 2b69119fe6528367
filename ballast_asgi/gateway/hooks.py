"""What the gateway's server protocol asks the gateway before any ASGI work (issue 31).

``Gateway`` (``root.py``) is a ``ServerHooks``: the protocol of the gateway
form (``ballast_asgi/server/wire.py`` and ``guarded.py``) finds these methods
on the app it serves and asks them per request head:

* ``shed_at_wire``: whether the stages would shed the request now (ADR 0017);
* ``serve_in_lane``: whether the lane takes the request instead of an ASGI task
  (ADR 0020).

Both answer only for the plain form, the same requests ``Gateway.__call__``
would send straight to the fused pipeline; anything else goes the ordinary way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ballast_asgi.core.forwarded import ForwardedTrust
from ballast_asgi.core.native import mypyc_attr
from ballast_asgi.core.shed import Shed, ShedHeaders
from ballast_asgi.core.types import RawHeaders, Scope
from ballast_asgi.middleware.admission import WIRE_READ
from ballast_asgi.middleware.pipeline import Pipeline
from ballast_asgi.ops.admin import relative_path

if TYPE_CHECKING:
    from ballast_asgi.gateway.compose import Stack


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (ADR 0021); ``Gateway`` is one
class ServerHooks:
    """The gateway's answers to its server protocol (see the module)."""

    #: The current stack (``Gateway.stack``; swapped whole by a reload).
    stack: Stack
    #: Whether the server may have rewritten ``scope["client"]`` (unknown: assume so).
    server_may_rewrite: bool
    forwarded: ForwardedTrust

    def shed_at_wire(
        self, method: str, path: str, raw_path: bytes, headers: RawHeaders, host: str | None,
        root_path: str = "", memo: list[object] | None = None,
    ) -> tuple[Shed, int, int, ShedHeaders, bytes] | None:  # fmt: skip
        """A request head the stages would shed now: the shed, counted, and its response
        (status, Retry-After seconds, headers, body); None: serve it the ordinary way.

        Called by the server protocol (``ballast_asgi/server/wire.py``) before any
        ASGI work. Only the plain form decides here (the fused pipeline straight
        behind the admin prefix: no access log, no discovery wrapper); a path under
        the admin prefix, a peer that is a trusted proxy and a server that may have
        rewritten the client address go the ordinary way. ``memo``: see
        ``middleware/at_wire.py`` (the head read once for a request that is not shed).
        """
        current = self.stack  # read once, like a request (ADR 0019)
        stack = current.direct
        if not isinstance(stack, Pipeline) or self.server_may_rewrite:
            return None
        if self.forwarded.networks and self.forwarded.is_trusted(host):
            return None
        prefix = current.router.passing  # ``AdminRouter.passes``, inlined
        if prefix is None or (
            relative_path({"path": path, "root_path": root_path}) if root_path else path
        ).startswith(prefix):
            return None
        shed = stack.wire.decide(method, path, raw_path, headers, host, memo)  # decide_at_wire
        if shed is None:
            return None
        status, seconds, shed_headers, body = stack.responder.response(shed)
        return shed, status, seconds, shed_headers, body

    def serve_in_lane(self, scope: Scope, cycle: Any) -> bool:
        """Serve this request in the lane (``lane.py``, ADR 0020): True once it is the lane's;
        False, with nothing counted: the server starts its ASGI task as always.

        Called by the server protocol (``ballast_asgi/server/guarded.py``) with the
        request's scope and cycle, instead of starting the task. The same plain form as
        ``shed_at_wire`` (and the same request ``__call__`` would send to the pipeline)."""
        current = self.stack  # read once, like a request (ADR 0019)
        lane = current.lane
        if lane is None:
            return False
        read = scope.get(WIRE_READ)
        if read is None or read[0] is not lane.admission:
            # Not read at the wire by this stack's admission this turn (which checked the
            # same plain form, just now): check it here.
            if self.server_may_rewrite:
                return False
            if self.forwarded.networks:
                client = scope.get("client")
                if self.forwarded.is_trusted(client[0] if client else None):
                    return False
            prefix = current.router.passing  # ``AdminRouter.passes``, inlined
            path = relative_path(scope) if scope.get("root_path") else scope["path"]
            if prefix is None or path.startswith(prefix):
                return False
        return lane.start(scope, cycle)


__all__ = ["ServerHooks"]
