"""``python -m ballast_asgi``: the ``ballast`` command (``ballast_asgi.server.cli``)."""

from __future__ import annotations

from ballast_asgi.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
