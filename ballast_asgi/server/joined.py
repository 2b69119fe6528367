"""The joined-write limit of the gateway's request cycle (``cycle.py``).

``ResponseCycle`` keeps a response's writes and writes them at once when the
response completes, the loop turns, or ``_JOIN_LIMIT`` bytes are pending (so
uvicorn's write flow control sees a large body as it goes). The
``JoinedWrites`` transport wrapper that used to live here (issue 18) is gone:
the cycle joins its own writes since issue 31; only the limit stays.
"""

from __future__ import annotations

#: Pending response bytes written at once without waiting for the loop to turn.
_JOIN_LIMIT = 64 * 1024
