"""Recipes as hostile input: fuzzed documents and bytes never crash the loader, malformed ones
through the CLI exit 2 with one line each, every number is bounded, recipe files are bounded
regular files, and YAML aliases are counted before anything walks them."""

from __future__ import annotations

import os
import random
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.commands import read_recipe
from pipeline.engine.errors import RecipeError, UserInputError
from pipeline.engine.graph import build_graph
from pipeline.engine.recipe import MAX_ALIAS_VALUES
from pipeline.stages import STAGES
from tests.helpers import SMOKE, _one_error_line, cli, count

_SECTIONS = [
    "data",
    "tokenizer",
    "teacher",
    "distill",
    "prune",
    "export",
    "quantize",
    "evaluate",
    "benchmark",
    "report",
    "extends",
    "name",
    "tokeniser",
    "teacher.train",
    "0",
    "",
]


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["unigram", "bpe", "nan", "-1", "1e9", "[", "{"]),
)


_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "lr",
                    "model",
                    "train",
                    "vocab_size",
                    "kind",
                    "heads",
                    "d_model",
                    "max_epochs",
                    "beam",
                    "src",
                    "tgt",
                    "files",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=10,
)


_recipes = st.one_of(
    st.dictionaries(st.sampled_from(_SECTIONS), _values, max_size=5),
    _values,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_recipes)
def test_fuzzed_recipes_never_crash(tmp_path, doc):
    count("fuzzed recipe documents tried")
    path = tmp_path / "fuzz.yaml"
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    path.write_text(text, encoding="utf-8")
    try:
        recipe, _ = read_recipe(path)
        build_graph(recipe, path, STAGES)
    except (RecipeError, UserInputError) as exc:
        text = str(exc)
        assert text and "Traceback" not in text
        assert all(line.startswith(str(path)) for line in getattr(exc, "lines", [text]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_fuzzed_bytes_never_crash_the_loader(tmp_path, blob):
    count("fuzzed recipe byte strings tried")
    path = tmp_path / "bytes.yaml"
    path.write_bytes(blob)
    try:
        recipe, _ = read_recipe(path)
        build_graph(recipe, path, STAGES)
    except (RecipeError, UserInputError):
        pass


def test_malformed_recipes_through_the_cli_exit_2_with_one_line(tmp_path):
    rng = random.Random(7)
    broken = [
        "teacher: {model: {heads: []}}\ntokenizer: {}",
        "tokenizer: {vocab_size: 1e99}",
        "\t\tbad",
        "data: {source: files}",
        "distill: {}",
        "export: {}",
        "data: {max_train: -3}",
        ": : :",
        "report: {}",
        "quantize: {}\n",
    ]
    for text in broken + [bytes(rng.randrange(256) for _ in range(40)).decode("latin-1") for _ in range(3)]:
        path = tmp_path / "m.yaml"
        path.write_text(text, encoding="utf-8")
        proc = cli("validate", str(path))
        count("malformed recipes through the CLI")
        err = [line for line in proc.stderr.decode().splitlines() if line.strip()]
        assert proc.returncode == 2 and len(err) >= 1 and all(line.startswith("error: ") for line in err), (text, err)
        assert "Traceback" not in proc.stderr.decode()


# --------------------------------------------------------------------------- bounded recipes


@pytest.mark.parametrize(
    "text, expect",
    [
        ("teacher: {train: {seed: " + "1" * 5000 + "}}\n", "more digits than a recipe takes"),
        ("teacher: {train: {seed: 0x" + "f" * 3000 + "}}\n", "integer too large"),
        ("extends: /dev/zero\n", "character device, not a regular file"),
        ("teacher: {train: {lr: .inf}}\n", "lr: must be a finite number"),
        ("teacher: {train: {warmup_steps: .nan}}\n", "warmup_steps: must be"),
        ("teacher: {train: {seed: 1.0e+23}}\n", "seed: must be an integer of a sane size"),
        ("teacher: {train: {seed: 1.0e+12}}\n", "seed: must be <= 4294967295"),
        ("teacher: {model: {d_model: 1.0e+9}}\n", "d_model: must be <= 65536"),
        ("teacher: {model: {d_model: 4096, ffn_dim: 65536, encoder_layers: 1000}}\n", "parameters, more than"),
        ("distill: {corpus: {length_penalty: -.inf}}\n", "length_penalty: must be"),
        (
            "data: {source: files, files: {train: {src: /dev/zero, tgt: /dev/zero}, valid: {tsv: /dev/zero}}}\n",
            "/dev/zero: a character device",
        ),
    ],
)
def test_unbounded_recipe_input_is_one_line(tmp_path, text, expect):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    err = _one_error_line(cli("validate", str(path), timeout=30), 2)
    assert expect in err, err


def test_recipe_files_are_bounded_regular_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "f.yaml").write_text("extends: fifo.yaml\n")
    assert "a fifo" in _one_error_line(cli("validate", str(tmp_path / "f.yaml"), timeout=30), 2)
    (tmp_path / "big.yaml").write_bytes(b"#" * (2 << 20))
    assert "larger than 1048576 bytes" in _one_error_line(cli("validate", str(tmp_path / "big.yaml"), timeout=30), 2)
    proc = cli("validate", str(SMOKE), "--set", "teacher.train.seed=" + "9" * 5000, timeout=30)
    assert "more digits" in _one_error_line(proc, 2)


# ------------------------------------------------------------------------------- YAML aliases


def _laughs(depth: int) -> str:
    """A recipe of nested aliases: ten of the level below at each level (10**(depth + 1) values)."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, depth + 1)]
    return "\n".join(lines + [f"teacher: {{train: {{note: *a{depth}}}}}"]) + "\n"


@pytest.mark.parametrize("depth", [3, 11])
def test_nested_yaml_aliases_are_refused_before_anything_walks_them(tmp_path, depth):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(depth))
    assert len(path.read_bytes()) < 1000
    started = time.monotonic()
    with pytest.raises(RecipeError, match="YAML aliases repeat more than"):
        read_recipe(path)
    assert time.monotonic() - started < 1  # depth 7 took 18 s, depth 11 over a minute
    if depth == 11:
        for command, store in (("validate", None), ("status", tmp_path / "store")):
            proc = cli(command, str(path), store=store, timeout=60)
            err = proc.stderr.decode()
            assert proc.returncode == 2 and err.count("error:") == 1 and "Traceback" not in err, err


def test_yaml_aliases_within_the_bound_and_recursive_ones(tmp_path):
    reused = tmp_path / "reused.yaml"
    reused.write_text(
        f"extends: {SMOKE}\nteacher: {{train: &train {{lr: 0.002, warmup_steps: 10}}}}\n"
        "distill: {student: {train: *train}}\n"
    )
    raw = read_recipe(reused)[1]
    assert raw["teacher"]["train"]["lr"] == raw["distill"]["student"]["train"]["lr"] == 0.002
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(RecipeError, match="a YAML alias inside the value it names"):
        read_recipe(tmp_path / "self.yaml")
    big = "[" + ", ".join(["&b [" + ", ".join(["1"] * 100) + "]"] + ["*b"] * (MAX_ALIAS_VALUES // 100 + 1)) + "]"
    with pytest.raises(RecipeError, match=r"--set teacher.note: YAML aliases repeat more than"):
        read_recipe(SMOKE, [f"teacher.note={big}"])
