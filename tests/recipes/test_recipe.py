"""Recipes: strict schema, one readable line per problem, exit code 2, no traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeline.commands import read_recipe
from pipeline.engine.errors import RecipeError
from tests.helpers import REPO, SMOKE, cli


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


MALFORMED = {
    "unknown_key": ("teacher:\n  trian: {}\ntokenizer: {}\n", "teacher.trian: unknown key (did you mean 'train'?)"),
    "wrong_type": ("tokenizer:\n  vocab_size: lots\n", "tokenizer.vocab_size: must be an integer, got 'lots'"),
    "negative_lr": ("tokenizer: {}\nteacher:\n  train:\n    lr: -1\n", "teacher.train.lr: must be > 0, got -1"),
    "negative_size": ("tokenizer:\n  vocab_size: -5\n", "tokenizer.vocab_size: must be >= 64, got -5"),
    "yaml_syntax": ("teacher:\n  train: {lr: 1\n", "YAML syntax error"),
    "empty": ("", "empty recipe"),
    "list_for_mapping": ("teacher: [1, 2]\ntokenizer: {}\n", "teacher: must be a mapping, got a list"),
    "top_level_list": ("- data\n- teacher\n", "top level must be a mapping, got a list"),
    "bad_literal": ("tokenizer:\n  kind: wordpiece\n", "tokenizer.kind: must be one of 'unigram', 'bpe' or 'teacher'"),
    "dropout_range": ("tokenizer: {}\nteacher:\n  model: {dropout: 1.5}\n", "teacher.model.dropout: must be < 1"),
    "no_budget": ("tokenizer: {}\nteacher:\n  train: {max_epochs: null}\n", "set a budget: max_steps or max_epochs"),
    "minutes_only": (
        "tokenizer: {}\nteacher:\n  train: {max_epochs: null, max_minutes: 5}\n",
        "max_minutes is a cap, not a budget",
    ),
    "missing_need": ("teacher: {}\n", "teacher: needs a 'tokenizer' section"),
    "wide_table": (
        "tokenizer: {}\nteacher:\n  model: {d_model: 64, embed_dim: 64}\n",
        "embed_dim (64) must be below d_model (64)",
    ),
    "extends_missing": ("extends: nowhere.yaml\n", "file not found"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_recipe_gives_one_line_and_exit_2(tmp_path, case):
    text, expected = MALFORMED[case]
    path = write(tmp_path, text)
    proc = cli("validate", str(path))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and str(path) in lines[0]
    assert expected in lines[0]


def test_missing_recipe_file(tmp_path):
    proc = cli("validate", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "file not found" in proc.stderr.decode()


def test_several_problems_each_get_a_line(tmp_path):
    path = write(tmp_path, "tokenizer:\n  vocab_size: 0\n  knd: bpe\n")
    with pytest.raises(RecipeError) as exc:
        read_recipe(path)
    assert len(exc.value.lines) == 2
    assert any("tokenizer.knd: unknown key (did you mean 'kind'?)" in line for line in exc.value.lines)


def test_extends_merges_and_child_wins(tmp_path):
    write(tmp_path, "tokenizer: {vocab_size: 500, kind: bpe}\nteacher:\n  train: {lr: 0.002}\n", "base.yaml")
    child = write(tmp_path, "extends: base.yaml\ntokenizer: {vocab_size: 700}\n", "child.yaml")
    recipe, raw = read_recipe(child)
    assert recipe.tokenizer.vocab_size == 700 and recipe.tokenizer.kind == "bpe"
    assert recipe.teacher.train.lr == 0.002
    assert recipe.name == "child"


def test_extends_cycle_is_an_error(tmp_path):
    write(tmp_path, "extends: b.yaml\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(RecipeError, match="cycle"):
        read_recipe(tmp_path / "a.yaml")


def test_overrides_are_typed_and_validated(tmp_path):
    path = write(tmp_path, "tokenizer: {}\nteacher: {}\n")
    recipe, raw = read_recipe(path, ["teacher.train.max_epochs=2", "teacher.model.pre_ln=true", "tokenizer.kind=bpe"])
    assert recipe.teacher.train.max_epochs == 2 and recipe.teacher.model.pre_ln is True
    assert raw["teacher"]["train"]["max_epochs"] == 2
    with pytest.raises(RecipeError, match=r"teacher\.train\.lr: must be > 0, got -1"):
        read_recipe(path, ["teacher.train.lr=-1"])
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        read_recipe(path, ["teacher.train.lr"])
    # A null removes an optional section.
    recipe, _ = read_recipe(path, ["teacher=null"])
    assert recipe.teacher is None


@pytest.mark.slow
def test_shipped_recipes_validate():
    for recipe in sorted(REPO.glob("recipes/*.yaml")):
        proc = cli("validate", str(recipe))
        assert proc.returncode == 0, (recipe, proc.stderr.decode())


def test_bare_yaml_on_off_means_the_word(tmp_path):
    """YAML 1.1 reads `on`/`off` as booleans; for a three-way switch the user meant the word."""
    path = write(tmp_path, "tokenizer: {}\nteacher:\n  train: {bf16: on}\n")
    recipe, _ = read_recipe(path)
    assert recipe.teacher.train.bf16 == "on"
    recipe, _ = read_recipe(path, ["teacher.train.bf16=off"])
    assert recipe.teacher.train.bf16 == "off"
    with pytest.raises(RecipeError, match=r"teacher\.train\.bf16: must be one of"):
        read_recipe(path, ["teacher.train.bf16=sometimes"])


def test_an_unfactorised_model_keeps_the_fingerprint_it_had_before_embed_dim(tmp_path):
    """embed_dim enters a model's config only when set: teachers and students configured before
    it existed are not retrained."""
    from pipeline.engine.recipe import dump_config

    path = write(tmp_path, "tokenizer: {}\nteacher: {}\n")
    plain, _ = read_recipe(path)
    assert "embed_dim" not in dump_config(plain.teacher)["model"]
    factorised, _ = read_recipe(path, ["teacher.model.embed_dim=32"])
    assert dump_config(factorised.teacher)["model"]["embed_dim"] == 32


def test_a_usage_error_is_one_message_and_exit_2():
    for args in (("validate", str(SMOKE), str(SMOKE)), ("run", str(SMOKE), "--no-such-option")):
        proc = cli(*args)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and "Traceback" not in err and "Error:" in err, err[-1500:]
