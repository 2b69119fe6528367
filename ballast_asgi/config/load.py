"""Loading the configuration: YAML file, then environment, then overrides.

Every error becomes one ``ConfigError`` line naming the key path and the allowed values.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ballast_asgi.config.models import (
    LIMITER_NAMES,
    UPSTREAM_LIST_TAG,
    UPSTREAM_URL_TAG,
    GatewayConfig,
)
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.redact import redact_userinfo

log = logging.getLogger("ballast.config")


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key]
                raise ConfigError(
                    f"{_where(key_node.start_mark)}: duplicate key {key!r} "
                    f"(first given at line {first.line + 1})"
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _where(mark: yaml.Mark | None) -> str:
    if mark is None:
        return "?"
    return f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}"


#: Union tags pydantic puts in error locations; users never wrote them.
_UNION_TAGS = frozenset({UPSTREAM_URL_TAG, UPSTREAM_LIST_TAG})


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line naming the first failing key path and what is allowed."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if x not in _UNION_TAGS) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(e["loc"])
        elif e["type"] == "missing":
            msg = "required key is missing"
        value = e.get("input")
        quiet = e["type"] in ("missing", "extra_forbidden") or isinstance(value, dict)
        said = "got " in msg or (isinstance(value, str) and value and value in msg)
        got = "" if quiet or said else f" (got {redact_userinfo(repr(value))})"
        allowed = _allowed_range(e["loc"])
        named = msg.startswith(f"{loc}.") or msg.startswith(f"{loc}/")  # the message names a key
        parts.append(f"{msg}{allowed}{got}" if named else f"{loc}: {msg}{allowed}{got}")
    return f"{source}: " + "; ".join(parts)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key close to a known one, else ``""``."""
    model: Any = GatewayConfig
    for key in [k for k in loc[:-1] if k not in _UNION_TAGS]:
        if not isinstance(key, str):
            continue  # a list index: the item's model is the list's
        fields = getattr(model, "model_fields", None)
        if fields is None or key not in fields:
            return ""
        model = _model_in(fields[key].annotation)
    fields = getattr(model, "model_fields", None)
    if fields is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(fields), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``annotation`` (``X | None``, ``tuple[X, ...]``), or None."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    for meta in getattr(annotation, "__metadata__", ()):
        found = _model_in(meta)
        if found is not None:
            return found
    origin = getattr(annotation, "__origin__", None)
    return _model_in(origin) if origin is not None and origin is not annotation else None


def _allowed_range(loc: tuple[int | str, ...]) -> str:
    """`` [allowed: lo..hi]`` for a numeric field with bounds, else ``""``."""
    model: Any = GatewayConfig
    field = None
    for key in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(key, str) or fields is None or key not in fields:
            return ""
        field = fields[key]
        model = field.annotation
    if field is None:
        return ""
    lo = hi = None
    for meta in field.metadata:
        lo = getattr(meta, "ge", None) if lo is None else lo
        lo = getattr(meta, "gt", None) if lo is None else lo
        hi = getattr(meta, "le", None) if hi is None else hi
    if lo is None and hi is None:
        return ""
    return f" [allowed: {'' if lo is None else lo}..{'' if hi is None else hi}]"


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    node = data
    *parents, leaf = path.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a mapping (``gateway:`` nesting unwrapped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_named_loader(str(path)))
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{_where(exc.problem_mark)}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty (it needs at least the upstream key)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    if set(data) == {"gateway"} and isinstance(data["gateway"], dict):
        data = dict(data["gateway"])
    return data


def _named_loader(name: str) -> type[_StrictLoader]:
    """A strict loader whose marks carry the file name."""

    class _Named(_StrictLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.name = name

    return _Named


def check_file(path: str | Path) -> GatewayConfig:
    """Validate a config file on its own (no environment), as ``ballast check-config`` does.

    The upstream may be left to ``BALLAST_UPSTREAM``; when the file names one it is checked.
    """
    return build_config(read_yaml(path), source=str(path), require_upstream=False)


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.get("BALLAST_UPSTREAM"):
        out["upstream"] = env["BALLAST_UPSTREAM"]
    if env.get("BALLAST_LIMITER"):
        name = env["BALLAST_LIMITER"].strip().lower()
        if name not in LIMITER_NAMES:
            raise ConfigError(
                f"BALLAST_LIMITER: unknown limiter {env['BALLAST_LIMITER']!r}; "
                f"allowed: {', '.join(LIMITER_NAMES)}"
            )
        out["limiter.algorithm"] = name
    if env.get("BALLAST_FIXED_LIMIT"):
        raw = env["BALLAST_FIXED_LIMIT"]
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(
                f"BALLAST_FIXED_LIMIT: must be an integer in 1..100000 (got {raw!r})"
            ) from None
        if not 1 <= value <= 100_000:
            raise ConfigError(f"BALLAST_FIXED_LIMIT: must be in 1..100000 (got {value})")
        out["limiter.fixed_limit"] = value
    if env.get("BALLAST_REDIS_URL"):
        out["rate_limit.redis_url"] = env["BALLAST_REDIS_URL"]
    if env.get("BALLAST_CANARY_SALT"):  # the split's secret, kept out of config files
        out["canary.salt"] = env["BALLAST_CANARY_SALT"]
    return out


def reference_layout(merged: dict[str, Any]) -> bool:
    """The reference layout rule, the only place it is written; True when it applied.

    A config document (file, then environment, then overrides, merged) that
    gives ``max_concurrent_requests`` a number and names no ``limiter.algorithm``
    means what it means to the reference gateway: a fixed cap of that many
    concurrent requests. So the loader writes ``limiter.algorithm: fixed`` into
    it. Anything that names the algorithm (``limiter.algorithm``,
    ``BALLAST_LIMITER``, ``--limiter``) wins. A ``GatewayConfig`` built in
    Python is never rewritten: there the algorithm comes from
    ``limiter.algorithm`` alone, so ``GatewayConfig()`` and
    ``GatewayConfig(max_concurrent_requests=1000)`` are the same config.
    See docs/adr/0007-one-default-per-value.md.
    """
    limiter = merged.get("limiter", {})
    if not isinstance(limiter, Mapping) or "algorithm" in limiter:
        return False  # named (or malformed: validation reports it)
    if merged.get("max_concurrent_requests") is None:
        return False
    _set_path(merged, "limiter.algorithm", "fixed")
    return True


def build_config(
    data: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    source: str = "config",
    *,
    require_upstream: bool = True,
) -> GatewayConfig:
    """Validate a mapping plus dotted-path overrides into a ``GatewayConfig``."""
    merged: dict[str, Any] = _deep_copy(data)
    for path, value in (overrides or {}).items():
        _set_path(merged, path, value)
    if reference_layout(merged):
        log.info(
            "%s: max_concurrent_requests without limiter.algorithm: the fixed limiter "
            "(set limiter.algorithm to choose another)",
            source,
        )
    try:
        config = GatewayConfig.model_validate(merged)
    except ValidationError as exc:  # reported first: a typo in 'upstream' says "did you mean"
        raise ConfigError(format_validation_error(exc, source)) from None
    if require_upstream and not merged.get("upstream") and not merged.get("discovery"):
        raise ConfigError(
            "BALLAST_UPSTREAM: not set; give the upstream URL (e.g. http://127.0.0.1:9101) "
            "in BALLAST_UPSTREAM, --upstream, or the config file's 'upstream' key"
        )
    return config


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(
    env: Mapping[str, str] | None = None,
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GatewayConfig:
    """YAML (``path`` or ``BALLAST_CONFIG``), then environment, then ``overrides``."""
    env = os.environ if env is None else env
    path = path or env.get("BALLAST_CONFIG") or None
    data = read_yaml(path) if path else {}
    layered = _env_overrides(env)
    layered.update(overrides or {})
    return build_config(data, layered, source=str(path) if path else "config")
