"""``experiments.bench.ab --variant NAME=TREE[:ARGS][@CONFIG]``: how a variant is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench.ab import main, parse_variant


def test_a_variant_is_a_name_a_tree_and_uvicorn_arguments() -> None:
    """NAME=TREE:ARGS gives the space-separated arguments and no config."""
    assert parse_variant("new=.:--access-log --no-server-header") == (
        "new", ".", ["--access-log", "--no-server-header"], None,
    )  # fmt: skip
    assert parse_variant("base=/work/wt/base") == ("base", "/work/wt/base", [], None)


def test_a_config_after_at_is_passed_as_an_absolute_path(tmp_path: Path) -> None:
    """@CONFIG (with or without arguments before it) names the YAML file, made absolute."""
    config = tmp_path / "noretry.yaml"
    config.write_text("retry:\n  enabled: false\n")
    assert parse_variant(f"off=.@{config}") == ("off", ".", [], str(config))
    assert parse_variant(f"off=.:--access-log@{config}") == (
        "off", ".", ["--access-log"], str(config),
    )  # fmt: skip


@pytest.mark.parametrize("spec", ["=.", "new=", "new=.@", "new", "new=.@/no/such/file.yaml"])
def test_a_malformed_variant_is_refused_naming_it(spec: str) -> None:
    """No name, no tree, an empty or missing config: a ValueError that quotes the variant."""
    with pytest.raises(ValueError, match="--variant"):
        parse_variant(spec)


def test_main_refuses_a_malformed_variant_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command line error exits with status 2 and says what is wrong."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--variant", "new=.@/no/such/file.yaml"])
    assert exit_info.value.code == 2
    assert "no config file" in capsys.readouterr().err
