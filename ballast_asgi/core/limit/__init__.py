"""Limit algorithms (pure): samples in, a concurrency limit out.

``make_limit(name, **params)`` builds one by its registry name: ``gradient``
(the default), ``fixed``, ``aimd``, ``vegas``, ``gradient2``.
"""

from __future__ import annotations

from typing import Any

from ballast_asgi.core.limit.aimd import AIMDLimit
from ballast_asgi.core.limit.base import LimitAlgorithm, Sample
from ballast_asgi.core.limit.fixed import FixedLimit
from ballast_asgi.core.limit.gradient import GradientLimit
from ballast_asgi.core.limit.gradient2 import Gradient2Limit
from ballast_asgi.core.limit.vegas import VegasLimit

ALGORITHMS: dict[str, type[Any]] = {
    "gradient": GradientLimit,
    "fixed": FixedLimit,
    "aimd": AIMDLimit,
    "vegas": VegasLimit,
    "gradient2": Gradient2Limit,
}

#: Parameters shared by the config; silently dropped by algorithms that lack them.
COMMON_PARAMS = frozenset({"initial_limit", "min_limit", "max_limit", "window_ms", "rng"})
_BOUNDS = frozenset({"initial_limit", "min_limit", "max_limit"})
#: The common parameters each algorithm takes, written out rather than read from its
#: ``__init__``'s signature: a compiled core (ADR 0021) has none to read.
#: ``tests/core/test_limit_algorithms.py`` checks it against the signatures.
TAKES: dict[str, frozenset[str]] = {
    "gradient": COMMON_PARAMS,
    "fixed": frozenset(),
    "aimd": _BOUNDS,
    "vegas": _BOUNDS,
    "gradient2": _BOUNDS,
}


def make_limit(name: str, **params: Any) -> LimitAlgorithm:
    """Build the algorithm called ``name``.

    Common parameters (``initial_limit``, ``min_limit``, ``max_limit``,
    ``window_ms``, ``rng``) are passed only to algorithms that take them; any
    other unknown parameter is a ``TypeError``. ``fixed`` takes ``limit``
    (falling back to ``initial_limit``).
    """
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise ValueError(f"unknown limit algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    if cls is FixedLimit and "limit" not in params and "initial_limit" in params:
        params["limit"] = params["initial_limit"]
    takes = TAKES[name]
    kwargs = {k: v for k, v in params.items() if k in takes or k not in COMMON_PARAMS}
    algorithm: LimitAlgorithm = cls(**kwargs)
    return algorithm


__all__ = [
    "ALGORITHMS",
    "AIMDLimit",
    "FixedLimit",
    "Gradient2Limit",
    "GradientLimit",
    "LimitAlgorithm",
    "Sample",
    "VegasLimit",
    "make_limit",
]
