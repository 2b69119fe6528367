"""Discovery values and their etcd layout (pure: standard library only).

Keys, under one prefix per service (default prefix ``/ballast``)::

    {prefix}/services/{service}/instances/{id}   one registered instance, on its lease
    {prefix}/services/{service}/config/current   the config version the gateways apply
    {prefix}/services/{service}/config/v/{N:012d} every version written (history)
    {prefix}/services/{service}/controller       the elected controller, on its lease

An instance's ``id`` is its URL percent-encoded, so a re-registration after a
lost lease writes the same key with the same value. Values are compact JSON:

* instance: ``{"url": "http://127.0.0.1:9101", "version": "v1"}``; a registrar
  that leaves on purpose first writes ``"leaving": true`` so that the
  controller removes it at once (see ``versions.py``);
* config version: ``{"number": N, "instances": [{"url", "version"}...],
  "written_at": unix_s, "revision": R}`` (``revision``: the etcd revision of
  the registration change it was computed from).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

_SERVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


class DiscoveryError(ValueError):
    """A malformed service name, instance URL, version or stored value."""


def check_service(name: str) -> str:
    """``name`` if it is a valid service name (letters, digits, ``.``, ``_``, ``-``)."""
    if not _SERVICE.match(name):
        raise DiscoveryError(
            f"service: {name!r} is not a valid name (1-128 of letters, digits, '.', '_', '-')"
        )
    return name


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an http(s) URL with a host and no userinfo."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise DiscoveryError(f"url: {url!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DiscoveryError(f"url: must be http://HOST:PORT or https://..., got {url!r}")
    if parts.username is not None or parts.query or parts.fragment:
        raise DiscoveryError(f"url: no userinfo, query or fragment allowed, got {url!r}")
    if port == 0:
        raise DiscoveryError(f"url: port must be 1..65535, got {url!r}")
    return url.rstrip("/")


def check_version(version: str) -> str:
    """``version`` if it is a short label such as ``v1`` or ``2024.10.1``."""
    if not _VERSION.match(version):
        raise DiscoveryError(f"version: {version!r} is not a valid label (1-64 of [A-Za-z0-9._+-])")
    return version


def parse_endpoint(url: str) -> tuple[str, int]:
    """An etcd endpoint ``http://HOST:PORT`` (or ``HOST:PORT``) as ``(host, port)``."""
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port or 2379
    except ValueError:
        raise DiscoveryError(f"etcd endpoint: {url!r} is not HOST:PORT") from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise DiscoveryError(
            f"etcd endpoint: {url!r} must be http://HOST:PORT (TLS is not supported yet)"
        )
    return parts.hostname, port


@dataclass(frozen=True, slots=True, order=True)
class Instance:
    """One registered upstream instance: its base URL and its release version."""

    url: str
    version: str = ""

    def to_json(self) -> dict[str, str]:
        """The JSON form stored in etcd and shown in ``/snapshot``."""
        return {"url": self.url, "version": self.version}


@dataclass(frozen=True, slots=True)
class Registration:
    """An instance key's value: the instance, and whether it is leaving on purpose."""

    instance: Instance
    leaving: bool = False

    def encode(self) -> bytes:
        """Compact JSON bytes for etcd."""
        doc: dict[str, object] = dict(self.instance.to_json())
        if self.leaving:
            doc["leaving"] = True
        return _dump(doc)

    @classmethod
    def decode(cls, raw: bytes) -> Registration:
        """Parse an instance value; ``DiscoveryError`` when it is not one."""
        doc = _load(raw, "instance")
        url, version = doc.get("url"), doc.get("version", "")
        if not isinstance(url, str) or not isinstance(version, str):
            raise DiscoveryError("instance: 'url' and 'version' must be strings")
        leaving = doc.get("leaving", False) is True
        return cls(Instance(check_url(url), check_version(version) if version else ""), leaving)


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    """Config version ``number``: the instance list every gateway applies."""

    number: int
    instances: tuple[Instance, ...]
    written_at: float = 0.0
    revision: int = 0

    def encode(self) -> bytes:
        """Compact JSON bytes for etcd."""
        return _dump(
            {
                "number": self.number,
                "instances": [i.to_json() for i in self.instances],
                "written_at": round(self.written_at, 6),
                "revision": self.revision,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> ConfigVersion:
        """Parse a config version; ``DiscoveryError`` when it is not one."""
        doc = _load(raw, "config version")
        number, items = doc.get("number"), doc.get("instances")
        if not isinstance(number, int) or number < 1 or not isinstance(items, list):
            raise DiscoveryError("config version: needs 'number' >= 1 and a list 'instances'")
        instances = []
        for item in items:
            if not isinstance(item, dict):
                raise DiscoveryError("config version: each instance must be an object")
            instances.append(Registration.decode(_dump(item)).instance)
        written_at = doc.get("written_at", 0.0)
        revision = doc.get("revision", 0)
        return cls(
            number,
            tuple(instances),
            float(written_at) if isinstance(written_at, int | float) else 0.0,
            revision if isinstance(revision, int) else 0,
        )


@dataclass(frozen=True, slots=True)
class Keys:
    """The etcd keys of one service."""

    service: str
    prefix: str = "/ballast"

    def __post_init__(self) -> None:
        check_service(self.service)
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise DiscoveryError(f"prefix: must start and not end with '/', got {self.prefix!r}")

    @property
    def base(self) -> str:
        """``{prefix}/services/{service}``."""
        return f"{self.prefix}/services/{self.service}"

    @property
    def instances(self) -> bytes:
        """The prefix every instance key starts with."""
        return f"{self.base}/instances/".encode()

    def instance(self, url: str) -> bytes:
        """The key of the instance at ``url`` (the same key every time)."""
        return self.instances + quote(check_url(url), safe="").encode()

    @property
    def current(self) -> bytes:
        """The key holding the current config version."""
        return f"{self.base}/config/current".encode()

    def history(self, number: int) -> bytes:
        """The key keeping config version ``number``."""
        return f"{self.base}/config/v/{number:012d}".encode()

    @property
    def leader(self) -> bytes:
        """The controller election key."""
        return f"{self.base}/controller".encode()


def _dump(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes, what: str) -> dict[str, object]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise DiscoveryError(f"{what}: not valid JSON") from None
    if not isinstance(doc, dict):
        raise DiscoveryError(f"{what}: must be a JSON object")
    return doc
