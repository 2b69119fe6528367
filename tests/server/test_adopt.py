"""uvicorn adopted through the ``core.adopt`` seam and live objects, never the call stack."""

from __future__ import annotations

import subprocess
import sys

from uvicorn.config import Config

from ballast_asgi.config import build_config
from ballast_asgi.core import adopt as seam
from ballast_asgi.gateway import build_gateway
from ballast_asgi.server.serve import adopt_loading, loading_configs


def test_the_package_registers_the_server_adopter_without_importing_the_server() -> None:
    """``import ballast_asgi`` registers one adopter and loads neither uvicorn nor the server."""
    code = (
        "import sys, ballast_asgi\n"
        "from ballast_asgi.core import adopt\n"
        "print(len(adopt._ADOPTERS), 'uvicorn' in sys.modules,"
        " 'ballast_asgi.server.serve' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False", "False"]


def test_adopt_calls_every_registered_adopter_once_each() -> None:
    """``register`` ignores a second registration; ``adopt`` hands each the app and name."""
    seen: list[tuple[object, str]] = []

    def adopter(app: object, name: str) -> None:
        seen.append((app, name))

    seam.register(adopter)
    seam.register(adopter)
    try:
        seam.adopt("app", "m:app")
    finally:
        seam._ADOPTERS.remove(adopter)
    assert seen == [("app", "m:app")]


def test_only_a_config_loading_that_app_string_is_adopted() -> None:
    """The config loading ``ballast_asgi.gateway:app`` is adopted; another app's, or one
    already loaded, is left alone."""
    gw = build_gateway(build_config({"upstream": "http://u.test"}), env={})
    quiet = {"access_log": False}  # no global logging changes
    ours, other = Config("ballast_asgi.gateway:app", **quiet), Config("other:app", **quiet)
    done = Config("ballast_asgi.gateway:app", **quiet)
    done.loaded = True
    found = loading_configs("ballast_asgi.gateway:app")
    assert any(c is ours for c in found) and not any(c is other or c is done for c in found)
    assert adopt_loading(gw, "ballast_asgi.gateway:app")
    assert (ours.proxy_headers, ours.date_header) == (False, False)
    assert (other.proxy_headers, other.date_header) == (True, True)
    assert gw.server_may_rewrite is False
