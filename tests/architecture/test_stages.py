"""A stage is declared in one place: adding one is a folder (its declaration and its build module)
and a line in the registry. Here a toy stage is written as such a folder outside the project, added
to the registry's list, planned from a recipe section of its own and built by the real runner."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pipeline.engine.errors import PipelineError, RecipeError
from pipeline.engine.recipe import recipe_schema
from pipeline.engine.runner import make_plan, run
from pipeline.engine.stage import Inputs, Output
from pipeline.engine.store import Store
from pipeline.stages import STAGES, Recipe

DECLARATION = '''
"""The line_count stage: how many training pairs the data holds, and their longest source."""
from dataclasses import dataclass

from pipeline.engine.recipe import PositiveInt, Strict
from pipeline.engine.stage import Inputs, Output, Planner, Section, Stage
from pipeline.engine.store import Artifact


class LineCountConfig(Strict):
    longest_over: PositiveInt = 10  # count the sources with more words than this
    more: dict = {}  # keys the build returns besides its two


@dataclass(frozen=True)
class LineCountInputs(Inputs):
    data: Artifact


@dataclass(frozen=True)
class LineCountOutput(Output):
    pairs: int
    long: int
    shortest: int | None = None  # not always there


def plan(p: Planner) -> None:
    if p.recipe.line_count is not None:
        p.add("line_count", p.recipe.line_count, {"data": "data"})


STAGE = Stage("line_count", 1, "count the training pairs", settings=LineCountConfig, inputs=LineCountInputs,
              plan=plan, build="toy_stages.line_count.build", output=LineCountOutput,
              sections=(Section("line_count", LineCountConfig),))
'''

BUILD = """
from pipeline.corpora.splits import split_lines


def run(ctx):
    sources = list(split_lines(ctx.inputs.data.path, "train", "src"))
    long = sum(len(s.split()) > ctx.settings.longest_over for s in sources)
    (ctx.out / "count.txt").write_text(f"{len(sources)} {long}\\n")
    return {"pairs": len(sources), "long": long, **ctx.settings.more}
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
    assert node.inputs == {"data": "data"} and node.config == {"longest_over": 12, "more": {}}
    store = Store(tmp_path / "store")
    run(plan, store)
    artifact = store.get(node.id)
    assert artifact.metrics["pairs"] == 50 and 0 < artifact.metrics["long"] < 50
    assert (artifact.path / "count.txt").read_text().split()[0] == "50"
    assert toy_stage.output.of(artifact.metrics).pairs == 50  # read through the declaration
    # The registry without it knows no such section.
    with pytest.raises(RecipeError, match="line_count: unknown key"):
        make_plan(recipe, [], STAGES, Recipe)


def test_a_stage_that_returns_a_key_its_output_lacks_fails_naming_it(toy_stage, tmp_path):
    stages = (*STAGES, toy_stage)
    schema = recipe_schema(section for stage in stages for section in stage.sections)
    recipe = tmp_path / "count.yaml"
    data = "data: {max_train: 20, max_valid: 5, test_sets: [test_2016_flickr], max_test: 5}\n"
    store = Store(tmp_path / "store")
    # An optional key is taken, and the manifest keeps the metrics as run() returned them.
    recipe.write_text(data + "line_count: {more: {shortest: 3}}\n")
    plan = make_plan(recipe, [], stages, schema)
    run(plan, store)
    manifest = store.get(plan.nodes[1].id).manifest
    assert manifest["metrics"] == {"pairs": 20, "long": manifest["metrics"]["long"], "shortest": 3}
    assert toy_stage.output.of(manifest["metrics"]).shortest == 3
    # A key the declaration lacks: the build fails, in one line naming the stage and the key.
    recipe.write_text(data + "line_count: {more: {longest: 9}}\n")
    plan = make_plan(recipe, [], stages, schema)
    with pytest.raises(PipelineError) as failed:
        run(plan, store)
    assert str(failed.value) == (
        "stage line_count failed: its metrics: key 'longest' is not in LineCountOutput "
        "(declared in toy_stages.line_count)"
    )
    assert not store.exists(plan.nodes[1].id)
    # Read back through the declaration, a renamed or missing key is an error naming it too.
    with pytest.raises(PipelineError, match="line_count-1: key 'long' of LineCountOutput is missing"):
        toy_stage.output.of({"pairs": 1}, "line_count-1")


def test_every_stage_declares_its_output():
    for stage in STAGES:
        assert issubclass(stage.output, Output) and stage.output is not Output, stage.kind


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
