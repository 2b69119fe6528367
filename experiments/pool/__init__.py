"""The pool experiment: one instance of three breaks; how much do clients see (docs/pool.md)."""
