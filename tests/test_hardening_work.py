"""Hardening, third round (issue 48), what is on disk: work folders are checked like artifacts
(encoded shards and offsets, KD corpus chunks, the top-k store, checkpoints and snapshots carry
sizes and digests written last; a resumed run rebuilds what fails, or says in one line which
folder to remove), decompression is bounded for every codec, and YAML aliases in a recipe are
counted before anything walks them."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import RecipeError
from pipeline.recipe import MAX_ALIAS_VALUES, load_recipe

from .conftest import SMOKE, cli

# ---------------------------------------------------------------------------- 2. recipe aliases
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
        load_recipe(path)
    assert time.monotonic() - started < 1  # depth 7 took 18 s, depth 11 over a minute
    if depth == 11:
        for command, store in (("validate", None), ("status", tmp_path / "store")):
            proc = cli(command, str(path), store=store, timeout=60)
            err = proc.stderr.decode()
            assert proc.returncode == 2 and err.count("error:") == 1 and "Traceback" not in err, err


def test_yaml_aliases_within_the_bound_and_recursive_ones(tmp_path):
    reused = tmp_path / "reused.yaml"
    reused.write_text(f"extends: {SMOKE}\nteacher: {{train: &train {{lr: 0.002, warmup_steps: 10}}}}\n"
                      "distill: {student: {train: *train}}\n")
    raw = load_recipe(reused)[1]
    assert raw["teacher"]["train"]["lr"] == raw["distill"]["student"]["train"]["lr"] == 0.002
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(RecipeError, match="a YAML alias inside the value it names"):
        load_recipe(tmp_path / "self.yaml")
    big = "[" + ", ".join(["&b [" + ", ".join(["1"] * 100) + "]"] + ["*b"] * (MAX_ALIAS_VALUES // 100 + 1)) + "]"
    with pytest.raises(RecipeError, match=r"--set teacher.note: YAML aliases repeat more than"):
        load_recipe(SMOKE, [f"teacher.note={big}"])
