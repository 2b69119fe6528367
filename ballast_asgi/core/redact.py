"""Credentials out of everything shown: URLs with ``user:password@`` are displayed redacted."""

from __future__ import annotations


def redact_url(url: str) -> str:
    """``url`` with any ``user[:password]@`` replaced by ``***@`` (for display only)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***" if "@" in url else url
    authority_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:authority_end]
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{rest[authority_end:]}"
