"""The project's error hierarchy. Translated to HTTP once, at the boundary."""

from __future__ import annotations


class BallastError(Exception):
    """Base class of every error this package raises on purpose."""


class HeaderError(BallastError):
    """A request line or header is refused: answered with ``status`` naming the header.

    400 when malformed, 413 when the declared body is too large, 431 when the
    headers are too large or too many.
    """

    def __init__(self, header: str, problem: str, status: int = 400) -> None:
        super().__init__(f"{header} {problem}")
        self.header = header
        self.problem = problem
        self.status = status


class ConfigError(BallastError):
    """Configuration is invalid: one line naming the field and the allowed values."""


class ContextMissingError(BallastError):
    """An inner stage ran without the admission stage in front of it."""
