"""The server: the ``ballast`` command, uvicorn under it, TLS, websockets, workers.

``cli`` (the ``ballast`` console script and ``python -m ballast_asgi``),
``serve`` (uvicorn with the gateway's guarded protocol), ``tls``, ``ws`` (the
websocket protocol's limits), ``workers``/``supervisor``/``worker_admin``
(``--workers N``), ``check`` (``ballast check-config``). Imports the
composition (``ballast_asgi.gateway``); nothing below imports this package."""
