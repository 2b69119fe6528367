"""Rate limits: one per key, per process or shared by several gateways through Redis.

``core/`` is pure policy (GCRA, the bounded key table, the Redis breaker, lease
sizing, charge-back accounting; standard library only, ``now`` passed in).
The drivers (``local``, ``redis_mode``, ``lease``, ``sync``) add the I/O, the
Redis client wrapper lives in ``client``, and ``middleware/ratelimit.py`` is the
thin ASGI stage. See ``docs/ratelimit.md``.
"""
