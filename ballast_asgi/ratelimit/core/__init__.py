"""Pure rate-limit policy: standard library only, time passed in as ``now``."""
