"""The calling end's pure core: config, per-host state, throttle, retry policy, counters.

Standard library only.
"""
