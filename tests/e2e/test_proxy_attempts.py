"""Issue 11.7: every upstream attempt is one the gateway chose and counted (no hidden retries)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.raw_http import ResettingListener
from tests.e2e.support import uvicorn_gateway

pytestmark = pytest.mark.e2e

REQUESTS = 15
MAX_ATTEMPTS = 3


def test_upstream_that_resets_sees_at_most_max_attempts_per_request(tmp_path: Path) -> None:
    """An upstream that resets every connection is tried at most max_attempts times per GET."""
    upstream = ResettingListener().start()
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"upstream: http://127.0.0.1:{upstream.port}\n"
        f"retry: {{max_attempts: {MAX_ATTEMPTS}, budget_ratio: 1.0, min_retries_per_s: 1000,"
        " backoff_base_ms: 0, backoff_max_ms: 0}\n"
        "breaker: {enabled: false}\n"
    )
    per_request = []
    try:
        with uvicorn_gateway(config) as (base, _pid), httpx.Client(timeout=10) as client:
            for i in range(REQUESTS):
                before = upstream.accepted
                response = client.get(f"{base}/reset/{i}")
                assert response.status_code == 502
                per_request.append(upstream.accepted - before)
            snap = json.loads(client.get(base + "/_ballast/snapshot").text)
    finally:
        upstream.stop()
    assert max(per_request) <= MAX_ATTEMPTS, per_request
    assert sum(per_request) == REQUESTS * MAX_ATTEMPTS  # each retry was the gateway's own
    assert snap["limiter"]["inflight"] == 0
