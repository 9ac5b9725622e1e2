"""A stage is declared in one place: adding one is a folder (its declaration and its build module)
and a line in the registry. Here a toy stage is written as such a folder outside the project, added
to the registry's list, planned from a recipe section of its own and built by the real runner."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pipeline.engine.errors import RecipeError
from pipeline.engine.recipe import recipe_schema
from pipeline.engine.runner import make_plan, run
from pipeline.engine.stage import Inputs
from pipeline.engine.store import Store
from pipeline.stages import STAGES, Recipe

DECLARATION = '''
"""The line_count stage: how many training pairs the data holds, and their longest source."""
from dataclasses import dataclass

from pipeline.engine.recipe import PositiveInt, Strict
from pipeline.engine.stage import Inputs, Planner, Section, Stage
from pipeline.engine.store import Artifact


class LineCountConfig(Strict):
    longest_over: PositiveInt = 10  # count the sources with more words than this


@dataclass(frozen=True)
class LineCountInputs(Inputs):
    data: Artifact


def plan(p: Planner) -> None:
    if p.recipe.line_count is not None:
        p.add("line_count", p.recipe.line_count, {"data": "data"})


STAGE = Stage("line_count", 1, "count the training pairs", settings=LineCountConfig, inputs=LineCountInputs,
              plan=plan, build="toy_stages.line_count.build", sections=(Section("line_count", LineCountConfig),))
'''

BUILD = """
from pipeline.corpora.splits import split_lines


def run(ctx):
    sources = list(split_lines(ctx.inputs.data.path, "train", "src"))
    long = sum(len(s.split()) > ctx.settings.longest_over for s in sources)
    (ctx.out / "count.txt").write_text(f"{len(sources)} {long}\\n")
    return {"pairs": len(sources), "long": long}
"""


@pytest.fixture
def toy_stage(tmp_path, monkeypatch):
    folder = tmp_path / "toy_stages" / "line_count"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    (folder / "__init__.py").write_text(textwrap.dedent(DECLARATION))
    (folder / "build.py").write_text(textwrap.dedent(BUILD))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("toy_stages.line_count", fromlist=["STAGE"]).STAGE
    for name in [m for m in sys.modules if m.startswith("toy_stages")]:
        del sys.modules[name]


def test_a_stage_is_a_folder_and_a_registry_line(toy_stage, tmp_path):
    stages = (*STAGES, toy_stage)  # the registry line
    schema = recipe_schema(section for stage in stages for section in stage.sections)
    recipe = tmp_path / "count.yaml"
    recipe.write_text(
        "data: {max_train: 50, max_valid: 5, test_sets: [test_2016_flickr], max_test: 5}\n"
        "line_count: {longest_over: 12}\n"
    )
    plan = make_plan(recipe, [], stages, schema)
    assert [n.name for n in plan.nodes] == ["data", "line_count"]
    node = plan.nodes[1]
    assert node.inputs == {"data": "data"} and node.config == {"longest_over": 12}
    store = Store(tmp_path / "store")
    run(plan, store)
    artifact = store.get(node.id)
    assert artifact.metrics["pairs"] == 50 and 0 < artifact.metrics["long"] < 50
    assert (artifact.path / "count.txt").read_text().split()[0] == "50"
    # The registry without it knows no such section.
    with pytest.raises(RecipeError, match="line_count: unknown key"):
        make_plan(recipe, [], STAGES, Recipe)


def test_inputs_are_typed_and_checked():
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Some(Inputs):
        data: object
        teacher: object | None = None
        evaluate: dict = field(default_factory=dict)

    assert Some.problems(["data", "teacher", "evaluate.a", "evaluate.b"]) == []
    assert Some.problems(["teacher", "evaluate", "model", "evaluate.x.y"]) == [
        "unknown input 'evaluate'",
        "unknown input 'model'",
        "input 'data' missing",
    ]
    got = Some.of({"data": 1, "evaluate.a": 2, "evaluate.b": 3})
    assert (got.data, got.teacher, got.evaluate) == (1, None, {"a": 2, "b": 3})
