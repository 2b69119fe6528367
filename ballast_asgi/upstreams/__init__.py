"""Several upstream instances: balancing, health checks, outlier ejection.

Pure cores (decisions from numbers, ``now`` and an injected ``random.Random``):
``balancer`` (power of two choices, weighted round robin), ``outlier``
(passive ejection), ``health`` (probe thresholds), ``pool`` (the instances and
the choice among them). Async driver: ``checker`` (active HTTP probes).
Adapter: ``selector`` (the proxy's selector seam).
"""
