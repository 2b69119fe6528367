"""What the stages report: Prometheus metrics behind one object, operator events, loop lag.

``metrics`` (``Metrics``, bounded labels, a null implementation for tests),
``events`` (one rate-limited structured line per state change) and
``loop_lag`` (the asyncio driver of ``core.loop_lag``). Below the stages:
imports only ``core`` and ``config``."""
