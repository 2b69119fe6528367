"""The pure upstream URL split (core) that both config validation and the proxy use."""

from __future__ import annotations

import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.upstream_url import UpstreamURLError, split_upstream_url
from ballast_asgi.proxy.upstream import Upstream


def test_split_gives_wire_host_default_port_path_and_hidden_credentials() -> None:
    """IDNA/lower-case host, the scheme's default port, the path as written, credentials kept."""
    u = split_upstream_url("HTTPS://user:pw@Bücher.Example/base")
    assert (u.scheme, u.host, u.port, u.path) == ("https", "xn--bcher-kva.example", 443, "/base")
    assert u.credentials == "user:pw" and "pw" not in repr(u)


@pytest.mark.parametrize(
    "url",
    ["ftp://h", "http://", "http://h:99999", "http://h/?q=1", "http://h/#f", "http://h/\x00",
     "http://h/" + "a" * 70_000],
)  # fmt: skip
def test_unusable_urls_are_refused_without_credentials(url: str) -> None:
    """Bad scheme, no host, bad port, query, fragment, control characters, huge path."""
    with pytest.raises(UpstreamURLError) as err:
        split_upstream_url(url.replace("://", "://u:secret@", 1))
    assert "secret" not in str(err.value)


def test_a_control_character_in_the_path_is_a_config_error() -> None:
    """A NUL in the upstream's path is refused by validation (it used to escape as httpx's)."""
    with pytest.raises(ConfigError, match="upstream"):
        build_config({"upstream": "http://a.test/x\x00y"})


def test_the_proxy_value_is_built_from_the_same_parts() -> None:
    """``Upstream.parse`` agrees with the split: host, port, encoded base path, credentials."""
    up = Upstream.parse("http://u:p@h.test:8080/a b/")
    assert (up.host, up.port, up.base_path) == ("h.test", 8080, b"/a%20b")
    assert up.has_credentials and up.display == "http://***@h.test:8080/a%20b"
