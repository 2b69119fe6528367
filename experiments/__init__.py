"""Tools that measure ballast-asgi: one subpackage per tool, shared code in ``_harness``."""
