"""The seam between the app a server loads by name and the server package that adopts it.

``uvicorn ballast_asgi.gateway:app`` builds the gateway when uvicorn imports
it; the server's settings (no proxy-headers rewrite, no ``date``/``server``
headers of its own, the guarded protocol, the TLS front, keep-alive and
connection caps) are the server package's business, and the composition may
not import the server (ADR 0005). So the composition calls ``adopt(app,
name)`` and the adopters registered here do the work; the package's
``__init__`` registers the server package's (imported only when called).
Likewise a server protocol the composition names by its config
(``server.shed_at_wire``: the shed at the wire) is handed out by
``protocol(name)`` from a loader the package registers. Stdlib only; nothing
is registered in a pure-core import.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``adopter(app, name)``: ``name`` is the ``module:attribute`` the server loads.
Adopter = Callable[[object, str], None]
_ADOPTERS: list[Adopter] = []
#: Server protocol classes by name, loaded on first use.
_PROTOCOLS: dict[str, Callable[[], type]] = {}


def register(adopter: Adopter) -> None:
    """Add ``adopter`` (once; a second registration of the same callable is ignored)."""
    if adopter not in _ADOPTERS:
        _ADOPTERS.append(adopter)


def adopt(app: object, name: str) -> None:
    """Let every registered adopter adopt the server loading ``app`` as ``name``."""
    for adopter in _ADOPTERS:
        adopter(app, name)


def provide_protocol(name: str, load: Callable[[], type]) -> None:
    """Register ``load`` as the way to get the server protocol class called ``name``."""
    _PROTOCOLS[name] = load


def protocol(name: str) -> type:
    """The server protocol class called ``name`` (``KeyError``: none registered)."""
    return _PROTOCOLS[name]()
