"""The project's error hierarchy. Translated to HTTP once, at the boundary."""

from __future__ import annotations


class BallastError(Exception):
    """Base class of every error this package raises on purpose."""


class HeaderError(BallastError):
    """A request header is malformed: answered with 400 naming the header."""

    def __init__(self, header: str, problem: str) -> None:
        super().__init__(f"{header} {problem}")
        self.header = header
        self.problem = problem


class ConfigError(BallastError):
    """Configuration is invalid: one line naming the field and the allowed values."""


class ContextMissingError(BallastError):
    """An inner stage ran without the admission stage in front of it."""
