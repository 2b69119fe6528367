"""Credentials out of everything shown: URLs with ``user:password@`` are displayed redacted.

``redact_url`` redacts one URL; ``redact_userinfo`` every URL inside a text
(an error message, a repr), where the password may itself contain ``@``.
"""

from __future__ import annotations

import re

__all__ = ["redact_url", "redact_userinfo"]

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s'\"]*@")


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


def redact_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text
