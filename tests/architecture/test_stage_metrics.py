"""What the engine reads of a stage's metrics comes from the stage's declaration, never from the
store or the runner: the run summary's figures (`Stage.headline`) and whether a time cap cut a
training (`Stage.cut`), which `status` reports for the node and what was built from it."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from pipeline.engine.runner import make_plan, node_status, run, summary_table
from pipeline.engine.store import Store
from pipeline.report.table import training_summary
from pipeline.stages import BY_KIND, STAGES, Recipe
from tests.helpers import SMOKE

CUT = "cut by time at step 12 of 40 (budget 3 epochs)"


def _stages(**changes: dict) -> tuple:
    """The registry with some declarations changed: {kind: {field: value}}."""
    return tuple(dataclasses.replace(s, **changes[s.kind]) if s.kind in changes else s for s in STAGES)


def _summary(result) -> dict[str, str]:
    """node -> the "key figures" cell of the run's summary, as the terminal shows it."""
    console = Console(record=True, width=250)
    console.print(summary_table(result, 1.0))
    rows = [line.split("│") for line in console.export_text().splitlines() if line.startswith("│")]
    return {cells[1].strip(): cells[5].strip() for cells in rows}


def test_the_summary_shows_the_figures_each_stage_declares(tmp_path):
    plan = make_plan(SMOKE, [], STAGES, Recipe)
    shown = _summary(run(plan, Store(tmp_path / "a"), until="tokenizer"))
    assert shown == {"data": "train_pairs=400", "tokenizer": "vocab_size=400"}

    # Declared otherwise, shown otherwise: the figures follow the declaration, in the metrics' order.
    stages = _stages(data={"headline": ("valid_pairs", "source", "no_such_metric")}, tokenizer={"headline": ()})
    plan = make_plan(SMOKE, [], stages, Recipe)
    shown = _summary(run(plan, Store(tmp_path / "b"), until="tokenizer"))
    assert shown == {"data": "source=multi30k, valid_pairs=40", "tokenizer": ""}


def test_status_flags_a_cut_by_the_metrics_the_stage_declares(tmp_path):
    store = Store(tmp_path)
    run(make_plan(SMOKE, [], STAGES, Recipe), store, until="tokenizer")
    rows = {r["node"]: r for r in node_status(store, make_plan(SMOKE, [], STAGES, Recipe))}
    assert rows["data"]["reason"] == rows["tokenizer"]["reason"] == ""

    # The same artifacts (the registry changed in memory, not a file: the same ids), read through a data
    # stage that declares its `source` as a cut: data is flagged, and what was built from it.
    plan = make_plan(SMOKE, [], _stages(data={"cut": ("source",)}), Recipe)
    rows = {r["node"]: r for r in node_status(store, plan)}
    assert rows["data"]["state"] == "cached" and rows["data"]["reason"] == "multi30k"
    assert rows["tokenizer"]["state"] == "cached" and rows["tokenizer"]["reason"] == "built from data, cut by time"


def test_train_and_prune_declare_where_a_cut_is_and_the_report_reads_the_same():
    train, prune = BY_KIND["train"], BY_KIND["prune"]
    trained = {"steps": 12, "budget": "3 epochs", "cut_by_time": CUT, "best_valid_loss": 3.2}
    assert train.cut_reason(trained) == CUT
    assert train.cut_reason({"steps": 40, "budget": "3 epochs"}) is None
    pruned = {
        "steps": [
            {"finetune": {"steps": 5, "cut_by_time": CUT}},
            {"finetune": None},  # a step rolled back before its fine-tune
            {"finetune": {"steps": 5}},
            {"finetune": {"steps": 2, "cut_by_time": "cut by time at step 2 of 5"}},
        ]
    }
    assert prune.cut_reason(pruned) == f"{CUT}; cut by time at step 2 of 5"
    assert prune.cut_reason({"steps": [{"finetune": {"steps": 5}}]}) is None
    # A stage that declares no cut is never flagged, whatever its metrics hold.
    assert BY_KIND["evaluate"].cut_reason(trained) is None and BY_KIND["train"].cut_reason(pruned) is None
    # The report's training table says the same as status does.
    assert training_summary(trained)["cut_by_time"] == train.cut_reason(trained)
    assert training_summary(pruned)["cut_by_time"] == prune.cut_reason(pruned)
    assert training_summary({"steps": 40, "budget": "3 epochs"})["cut_by_time"] is None


def test_every_stage_declares_figures_and_only_train_and_prune_a_cut():
    assert all(s.headline for s in STAGES), [s.kind for s in STAGES if not s.headline]
    assert {s.kind for s in STAGES if s.cut} == {"train", "prune"}
