"""Pure policy: standard library only, time and randomness passed in.

Limits and the limiter, the priority queue, breaker, retry budget, deadline and
priority arithmetic, capacity accounting and the per-attempt outcome. Nothing
here imports a web framework, an HTTP client, a metrics library or a config
loader (``tests/test_layering.py`` checks it in a fresh interpreter).
"""
