"""The house's rules, read from the imports (lazy ones inside functions included): mt_runtime (the
runtime's own distribution) imports nothing of this repository but itself; model/ stands on
its own; pipeline/'s subpackages are layers, each importing only the layers below it; a stage is a
thin layer over library modules, so no stage reaches another stage or the machinery that
schedules it; and nothing imports in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys

from pipeline.engine.code_digest import PACKAGES, PROJECT_ROOT, import_statements, stage_code
from pipeline.stages import BY_KIND, STAGES

# pipeline/'s subpackages, lowest first: a module may import its own subpackage and those ranked
# below it (docs/architecture.md draws them).
LAYERS = {
    "engine": 1,
    "corpora": 2,
    "measure": 3,
    "export": 3,
    "report": 4,
    "training": 4,
    "quantize": 4,
    "stages": 5,
    "commands": 6,
}
MACHINERY = {"pipeline/engine/graph.py", "pipeline/engine/runner.py", "pipeline/stages/__init__.py"}


def _modules() -> dict[str, str]:
    """module name -> path, for every module of model/, pipeline/ and mt_runtime."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted((PROJECT_ROOT / folder).glob("**/*.py")):
            parts = [top, *path.relative_to(PROJECT_ROOT / folder).with_suffix("").parts]
            if top == "model" and parts[1] == "runtime":
                continue  # mt_runtime's folder
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path, modules: dict) -> set[str]:
    """The project modules `name` imports (`from pkg import module` names the module, not pkg)."""
    found = set()
    for base, names in import_statements(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"):
        named = [f"{base}.{n}" for n in names]
        found |= {m for m in named if m in modules}
        if not all(m in modules for m in named):
            found.add(base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if parts[0] in ("mt_runtime", "model"):
        return parts[0], {"mt_runtime": -1, "model": 0}[parts[0]]
    sub = parts[1] if len(parts) > 1 else ""
    return sub, LAYERS.get(sub, 7)  # pipeline/__init__ and __main__: the top


def test_model_never_imports_pipeline_and_the_runtime_only_itself():
    graph = _graph()
    assert len([m for m in graph if m.startswith("mt_runtime.")]) >= 9
    for name, imported in graph.items():
        if name.startswith("model"):
            assert all(m.split(".")[0] in ("model", "mt_runtime") for m in imported), (
                f"{name} imports {sorted(imported)}"
            )
        if name.startswith("mt_runtime"):
            assert all(m.startswith("mt_runtime") for m in imported), f"{name} imports {sorted(imported)}"


def test_every_subpackage_imports_only_the_layers_below_it():
    upward = []
    for name, imported in _graph().items():
        sub, rank = _layer(name)
        upward += [f"{name} -> {m}" for m in imported if _layer(m)[0] != sub and _layer(m)[1] >= rank]
    assert not upward, upward


def test_no_import_cycle():
    graph, state, cycles = _graph(), {}, []

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for up in sorted(graph[name]):
            if state.get(up) == "open":
                cycles.append(path[path.index(up) :] + [up] if up in path else [name, up])
            elif up not in state:
                visit(up, path + [up])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_no_stage_imports_another_stage_or_the_machinery():
    for stage in STAGES:
        own = f"pipeline/stages/{stage.kind}/"
        reached = set(stage_code(stage.declaration)) | set(stage_code(stage.build))
        assert own + "build.py" in reached and own + "__init__.py" in reached
        others = {f for f in reached if f.startswith("pipeline/stages/") and not f.startswith(own)}
        assert not others and not reached & MACHINERY, f"{stage.kind} reaches {sorted(others | (reached & MACHINERY))}"


def test_the_registry_imports_no_torch():
    # Planning a run (and `export-package`, `report`) reads every declaration: none imports torch.
    code = "import sys; import pipeline.stages, pipeline.commands.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_code_a_stage_runs_in_a_child_process_is_in_its_fingerprint():
    # The benchmark measures in fresh processes (python -m pipeline.measure.process): the runtime it
    # times is code the stage runs, so a change to it must rebuild the benchmark.
    reached = set(stage_code(BY_KIND["benchmark"].build))
    assert {
        "pipeline/measure/process.py",
        "pipeline/measure/latency.py",
        "pipeline/measure/versus.py",
        "pipeline/measure/speed.py",
        "model/runtime/mt_runtime/translator.py",
        "pipeline/measure/translators.py",
    } <= reached


def _third_party(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }
    return imported - set(sys.stdlib_module_names) - {"__future__"}


def test_the_runtime_needs_only_its_declared_dependencies():
    # mt-runtime's pyproject declares onnxruntime, tokenizers and NumPy (aiohttp: the serve extra);
    # layout.py, which the writer imports too, the standard library alone.
    folder = PROJECT_ROOT / PACKAGES["mt_runtime"]
    for path in folder.glob("*.py"):
        allowed = {"numpy", "onnxruntime", "tokenizers"} | ({"aiohttp"} if path.name == "serve.py" else set())
        assert _third_party(path) <= allowed, (path.name, _third_party(path))
    assert _third_party(folder / "layout.py") == set()


def test_no_test_imports_a_stage_build_module():
    # A stage's build.py only wires library calls: a test that needs a name from one says that
    # name is in the wrong place (a test runs a stage through STAGE.load(), as the runner does).
    builds = {stage.build for stage in STAGES}
    found = []
    tests = PROJECT_ROOT / "tests"
    for path in sorted(tests.glob("**/*.py")):
        rel = path.relative_to(tests).as_posix()
        module = ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
        for base, names in import_statements(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            targets = [f"{base}.{n}" for n in names if base in builds or f"{base}.{n}" in builds]
            targets += [base] if base in builds and not names else []
            found += [f"{rel}: {t}" for t in targets]
    assert not found, found


def test_library_code_a_stage_wires_is_in_its_fingerprint():
    # What moved out of the stages' build.py into the libraries still rebuilds the stage when it changes.
    wired = {
        "data": {"pipeline/corpora/cleaning.py", "pipeline/corpora/multi30k.py", "pipeline/corpora/user_files.py"},
        "tokenizer": {"pipeline/corpora/vocabulary.py"},
        "import_teacher": {"pipeline/training/teacher_import.py"},
        "kd_corpus": {"pipeline/training/kd_corpus.py", "pipeline/corpora/kd_chunks.py"},
        "export": {"pipeline/measure/parity.py", "pipeline/export/shortlist.py", "pipeline/export/card.py"},
        "evaluate": {"pipeline/measure/evaluation.py"},
        "train": {"pipeline/training/from_teacher.py", "pipeline/training/validation.py", "model/torch_greedy.py"},
        "prune": {"pipeline/training/prune_steps.py", "pipeline/training/prune_latency.py"},
    }
    for kind, files in wired.items():
        stage = BY_KIND[kind]
        assert files <= set(stage_code(stage.declaration)) | set(stage_code(stage.build)), kind
