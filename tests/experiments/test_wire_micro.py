"""The in-process timing of the wire's shed (issue 31 item 1): it times what it says."""

from __future__ import annotations

import asyncio

import uvloop

from experiments.bench.wire_micro import DOA, pieces, wire_protocol


def test_the_timed_protocol_sheds_each_request_with_one_write() -> None:
    """Fed the dead-on-arrival request three times, the wire writes three responses."""
    loop = uvloop.new_event_loop()
    try:
        proto, gateway, transport = wire_protocol(loop)
        for _ in range(3):
            proto.data_received(DOA)
        assert transport.writes == 3
        assert proto.server_state.total_requests == 3
        assert 'reason="deadline"' in gateway.metrics.exposition().decode()
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_every_piece_is_reported_in_microseconds() -> None:
    """Six labelled pieces, each a non-negative number."""
    lines = pieces(number=20, repeat=1)
    asyncio.set_event_loop(None)
    assert [line.split(":")[0] for line in lines] == [
        "whole shed, data_received", "protocol, decision stubbed", "httptools feed_data alone",
        "at_wire.decide (counted)", "ShedResponder.response", "Gateway.shed_at_wire",
    ]  # fmt: skip
    assert all(float(line.rsplit(":", 1)[1]) >= 0 for line in lines)
