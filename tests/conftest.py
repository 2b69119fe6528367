"""Shared fixtures: anyio on asyncio only; no permit left in flight; both stack compositions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (the gateway's loop)."""
    return "asyncio"


@pytest.fixture(autouse=True)
def no_permits_left_in_flight() -> Iterator[None]:
    """After every test, no limiter created during it still holds a permit."""
    from ballast_asgi.core.limiter import live_limiters

    before = max((lim.serial for lim in live_limiters()), default=0)
    yield
    leaked = [
        (lim.serial, lim.inflight)
        for lim in live_limiters()
        if lim.serial > before and lim.inflight != 0
    ]
    assert not leaked, f"limiters left with permits in flight (serial, inflight): {leaked}"


#: Test modules whose stacks come from ``build_stack`` (the gateway, ``install``/``wrap``):
#: each of their tests runs twice, against the stages as one ``Pipeline`` and as the
#: nested middlewares (issue 18: both compositions keep every behaviour).
BOTH_COMPOSITIONS = frozenset(
    {
        "test_access_log",
        "test_body_stage",
        "test_canary_gateway",
        "test_capacity",
        "test_discovery_gateway",
        "test_dry_run",
        "test_gateway",
        "test_gateway_e2e",
        "test_in_app_routes_and_deadlines",
        "test_install",
        "test_ops_admin",
        "test_overload_e2e",
        "test_pool_gateway",
        "test_priority_and_reload_integration",
        "test_proxy_target",
        "test_ratelimit_middleware",
        "test_ratelimit_reload",
        "test_request_head_hardening",
    }
)


@pytest.fixture(autouse=True)
def stack_composition(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pipeline`` (the default) or ``chain``: how ``build_stack`` composes the stages."""
    from ballast_asgi.gateway import stack

    kind: str = getattr(request, "param", "pipeline")
    monkeypatch.setattr(stack, "PIPELINE", kind == "pipeline")
    return kind


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run the modules in ``BOTH_COMPOSITIONS`` against both compositions."""
    if metafunc.module.__name__.rsplit(".", 1)[-1] in BOTH_COMPOSITIONS:
        metafunc.parametrize("stack_composition", ["pipeline", "chain"], indirect=True)
