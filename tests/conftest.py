"""Shared fixtures: anyio on asyncio only."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (the gateway's loop)."""
    return "asyncio"
