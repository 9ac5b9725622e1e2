"""The house's rules, read from the imports (lazy ones inside functions included): a stage is a
thin layer over library modules, so no stage reaches another stage or the machinery that
schedules it, and model/ stands on its own."""

from __future__ import annotations

from pipeline.engine.code_digest import PROJECT_ROOT, stage_code
from pipeline.stages import STAGES

MACHINERY = {"pipeline/engine/graph.py", "pipeline/engine/runner.py", "pipeline/commands/cli.py", "pipeline/stages/__init__.py"}


def test_no_stage_imports_another_stage_or_the_graph():
    for kind, info in STAGES.items():
        own = info.module.replace(".", "/") + ".py"
        reached = set(stage_code(info.module))
        assert own in reached
        others = {f for f in reached if f.startswith("pipeline/stages/") and f != own}
        assert not others and not reached & MACHINERY, f"{kind} reaches {sorted(others | (reached & MACHINERY))}"


def test_model_never_imports_pipeline():
    for path in sorted((PROJECT_ROOT / "model").glob("*.py")):
        reached = stage_code(f"model.{path.stem}")
        assert all(f.startswith("model/") for f in reached), f"model/{path.name} reaches {sorted(reached)}"


def test_code_a_stage_runs_in_a_child_process_is_in_its_fingerprint():
    # The benchmark measures in fresh processes (python -m pipeline.measure.speed): the runtime it
    # times is code the stage runs, so a change to it must rebuild the benchmark.
    reached = set(stage_code(STAGES["benchmark"].module))
    assert {"pipeline/measure/speed.py", "model/runtime.py", "pipeline/measure/translators.py"} <= reached
