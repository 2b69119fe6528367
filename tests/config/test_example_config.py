"""The example configs stay in sync with GatewayConfig and validate.

``examples/ballast.example.yaml`` must name every field of every section
(walking ``model_fields`` recursively, into list items such as rules), set each
one to its default (except the required upstream and the illustrative rule),
and document each key in a comment with its default, its numeric range and its
allowed literal values.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ballast_asgi.config import GatewayConfig, load_config, read_yaml
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.priority import Priority

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "ballast.example.yaml"
#: Keys whose example value is deliberately not the default.
ILLUSTRATIVE = {
    ("upstream",),
    ("priority", "rules"),
    ("discovery",),
    ("rate_limit", "routes"),
    ("rate_limit", "overrides"),
    ("routes",),
}

Key = tuple[str, ...]


def _submodel(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds, and whether it holds a sequence of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, True
    return None, False


def _fields(model: type[BaseModel], prefix: Key = ()) -> Iterator[tuple[Key, FieldInfo]]:
    """Every field path, depth first; list-of-model fields add their item fields."""
    for name, info in model.model_fields.items():
        key = (*prefix, name)
        yield key, info
        sub, _ = _submodel(info.annotation)
        if sub is not None:
            yield from _fields(sub, key)


def _leaves() -> list[tuple[Key, FieldInfo]]:
    return [(k, i) for k, i in _fields(GatewayConfig) if _submodel(i.annotation)[0] is None]


def _lookup(data: Any, key: Key) -> Any:
    """Follow ``key`` through mappings; a list is entered through its first item."""
    node = data
    for part in key:
        if isinstance(node, list):
            assert node, f"{'.'.join(key)}: give at least one example item"
            node = node[0]
        assert isinstance(node, dict) and part in node, f"example lacks {'.'.join(key)}"
        node = node[part]
    return node


def _key_lines(node: yaml.Node, prefix: Key = ()) -> Iterator[tuple[Key, int]]:
    """(key path, 0-based line) of every mapping key; lists through their first item."""
    if isinstance(node, yaml.SequenceNode) and node.value:
        yield from _key_lines(node.value[0], prefix)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = (*prefix, k.value)
            yield key, k.start_mark.line
            yield from _key_lines(v, key)


def _comment(lines: list[str], line: int) -> str:
    """The inline comment on ``line`` plus the comment block right above it."""
    parts = [lines[line].partition("#")[2]]
    above = line - 1
    while above >= 0 and lines[above].lstrip().startswith("#"):
        parts.append(lines[above].lstrip().lstrip("#"))
        above -= 1
    return " ".join(parts)


def _spellings(bound: float) -> set[str]:
    if isinstance(bound, float):
        return {repr(bound), *([str(int(bound))] if bound.is_integer() else [])}
    return {str(bound), f"{bound:_}"}


def _bounds(info: FieldInfo) -> list[float]:
    out: list[float] = []
    for meta in info.metadata:
        for attr in ("ge", "gt", "le", "lt"):
            if isinstance(meta, annotated_types.BaseMetadata) and hasattr(meta, attr):
                out.append(getattr(meta, attr))
    return out


def _literals(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if isinstance(annotation, types.UnionType):
        return tuple(v for a in typing.get_args(annotation) for v in _literals(a))
    return ()


@pytest.fixture(scope="module")
def example_text() -> str:
    return EXAMPLE.read_text()


def test_walk_sees_every_section() -> None:
    """The field walk reaches nested sections and list items (guards the test itself)."""
    keys = {k for k, _ in _leaves()}
    assert ("admission_queue", "max_queue_size") in keys
    assert ("priority", "rules", "path") in keys
    assert ("priority", "consumers", "keys") in keys
    assert len(keys) > 50


def test_example_covers_every_field() -> None:
    """Every field of every section of GatewayConfig appears in the example."""
    data = read_yaml(EXAMPLE)
    missing = []
    for key, _ in _fields(GatewayConfig):
        try:
            _lookup(data, key)
        except AssertionError:
            missing.append(".".join(key))
    assert not missing, f"examples/ballast.example.yaml lacks: {missing}"


def test_example_validates_and_uses_the_defaults() -> None:
    """The example loads, and each value equals the field's default."""
    cfg = load_config(env={}, path=EXAMPLE)
    for key, info in _fields(GatewayConfig):
        if any(key[: len(i)] == i for i in ILLUSTRATIVE) or _submodel(info.annotation)[0]:
            continue
        assert _attr(cfg, key) == info.get_default(call_default_factory=True), ".".join(key)


def _attr(obj: Any, key: Key) -> Any:
    for part in key:
        obj = getattr(obj, part)
    return obj


def test_every_key_is_documented_with_default_and_range(example_text: str) -> None:
    """Each leaf key's comment states its default (or that it is required) and its range."""
    lines = example_text.splitlines()
    where = dict(_key_lines(yaml.compose(example_text)))
    problems = []
    for key, info in _leaves():
        if key not in where:
            problems.append(f"{'.'.join(key)}: missing")
            continue
        text = _comment(lines, where[key]).lower()
        word = "required" if info.is_required() else "default"
        if word not in text:
            problems.append(f"{'.'.join(key)}: no '{word}' in comment")
        for bound in _bounds(info):
            if not _spellings(bound) & set(_tokens(text)):
                problems.append(f"{'.'.join(key)}: comment lacks bound {bound}")
        for literal in _literals(info.annotation):
            if str(literal) not in text:
                problems.append(f"{'.'.join(key)}: comment lacks allowed value {literal}")
    assert not problems, "\n".join(problems)


def _tokens(text: str) -> list[str]:
    for sep in "(),;[]":
        text = text.replace(sep, " ")
    return [t.rstrip(".") for word in text.split() for t in word.split("..")]


@pytest.mark.parametrize("name", ["ballast.demo.yaml", "ballast.production.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    """The demo and production examples load without error."""
    assert isinstance(load_config(env={}, path=EXAMPLES / name), GatewayConfig)


def test_demo_trusts_the_header() -> None:
    """The demo config lets the load generator tag tiers with X-Priority."""
    cfg = load_config(env={}, path=EXAMPLES / "ballast.demo.yaml")
    clf = Classifier(cfg.priority)
    assert clf.classify("GET", "/", [(b"x-priority", b"0")], "203.0.113.5") == (
        Priority.CRITICAL,
        False,
    )


def test_production_does_not_trust_outsiders() -> None:
    """The production example ignores a forged header but honours the internal network."""
    cfg = load_config(env={}, path=EXAMPLES / "ballast.production.yaml")
    assert not cfg.priority.trust_header
    assert cfg.admission_queue.enabled and cfg.admission_queue.per_priority
    assert cfg.admin.token
    clf = Classifier(cfg.priority)
    forged = [(b"x-priority", b"critical")]
    assert clf.classify("GET", "/home", forged, "198.51.100.7") == (Priority.STANDARD, True)
    assert clf.classify("GET", "/home", forged, "10.2.3.4") == (Priority.CRITICAL, False)
    assert clf.classify("POST", "/checkout/cart", [], "198.51.100.7")[0] is Priority.CRITICAL
    assert clf.classify("GET", "/batch/nightly", [], "198.51.100.7")[0] is Priority.BULK
