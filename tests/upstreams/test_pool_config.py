"""`upstream` as a list (YAML, BALLAST_UPSTREAM) and the `upstreams` section."""

from __future__ import annotations

from pathlib import Path

import pytest

from ballast_asgi.config import build_config, load_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.gateway.pools import build_pool, policy


def test_single_url_unchanged() -> None:
    """One URL stays a string and is one instance."""
    cfg = build_config({"upstream": "http://127.0.0.1:9101/"})
    assert cfg.upstream == "http://127.0.0.1:9101"
    assert [i.url for i in cfg.instances] == ["http://127.0.0.1:9101"]


def test_env_comma_separated() -> None:
    """BALLAST_UPSTREAM with commas is a list of instances of weight 1."""
    cfg = load_config(env={"BALLAST_UPSTREAM": "http://a:1, http://b:2,http://c:3/"})
    assert [(i.url, i.weight) for i in cfg.instances] == [
        ("http://a:1", 1.0), ("http://b:2", 1.0), ("http://c:3", 1.0),
    ]  # fmt: skip


def test_yaml_list_of_urls_and_objects(tmp_path: Path) -> None:
    """The YAML list mixes plain URLs and {url, weight} objects."""
    path = tmp_path / "c.yaml"
    path.write_text("upstream:\n  - http://a:1\n  - {url: 'http://b:2', weight: 3}\n")
    cfg = load_config(env={}, path=path)
    assert [(i.url, i.weight) for i in cfg.instances] == [("http://a:1", 1.0), ("http://b:2", 3.0)]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("http://a:1,ftp://b", "upstream.1.url"),
        ([{"url": "http://a:1", "weight": 0}], "upstream.0.weight"),
        (["http://a:1", "http://a:1"], "same instance URL twice"),
        ([], "1..64 instances"),
        ([{"url": "http://a:1", "color": "red"}], "upstream.0.color: unknown key"),
    ],
)
def test_bad_lists_name_the_field(value: object, needle: str) -> None:
    """A bad list is a ConfigError naming the item and field."""
    with pytest.raises(ConfigError, match=needle):
        build_config({"upstream": value}, require_upstream=False)


def test_upstreams_section_validates() -> None:
    """Settings are range-checked with the key path in the message."""
    with pytest.raises(ConfigError, match=r"upstreams.outlier.base_ejection_ms"):
        outlier = {"base_ejection_ms": 9, "max_ejection_ms": 5}
        build_config({"upstream": "http://a:1", "upstreams": {"outlier": outlier}})
    with pytest.raises(ConfigError, match=r"upstreams.health_check.path"):
        build_config({"upstream": "http://a:1", "upstreams": {"health_check": {"path": "x"}}})
    with pytest.raises(ConfigError, match=r"upstreams.balancer"):
        build_config({"upstream": "http://a:1", "upstreams": {"balancer": "random"}})


def test_policy_and_pool_from_config() -> None:
    """The pool is built with the configured policy and one limiter per instance."""
    cfg = build_config({
        "upstream": "http://a:1,http://b:2",
        "upstreams": {"balancer": "round_robin", "outlier": {"consecutive_failures": 2},
                      "health_check": {"interval_ms": 100}},
    })  # fmt: skip
    p = policy(cfg)
    assert p.balancer == "round_robin" and p.outlier.consecutive_failures == 2
    assert p.health.interval_ms == 100
    import random

    pool = build_pool(cfg, random.Random(0))
    assert [i.url for i in pool.instances] == ["http://a:1", "http://b:2"]
    assert pool.instances[0].limiter is not pool.instances[1].limiter
    assert pool.instances[0].limiter.limit == cfg.limiter.initial_limit
