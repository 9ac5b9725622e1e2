"""From a recipe to the DAG of stage runs (nodes), each declared by its inputs and config.

A node is one artifact to build: its stage kind says which code runs, its config is exactly
what that code reads, and its inputs name the upstream nodes. Fingerprints follow from these.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from model.files import UnsafeFile, open_regular
from model.hf_checkpoint import UnsafeCheckpoint, file_digests

from .code_digest import combined, stage_code
from .errors import RecipeError, UserInputError
from .recipe import MODEL_NODES, BenchmarkNode, EvaluateNode, Recipe, ReportNode, TrainNode, dump_config
from ..stages import STAGES
from .store import artifact_id, fingerprint


@dataclass
class Node:
    name: str  # unique in the graph: "teacher", "evaluate.int8_dynamic"
    stage: str  # the code that runs: a key of STAGES
    config: Any  # plain data (JSON-able); hashed into the fingerprint
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream node name
    settings: Any = None  # the typed config object handed to the stage
    fingerprint: str = ""
    build: str = ""  # a forced rebuild's artifact id; "" for the build the fingerprint names
    code: dict[str, str] = field(default_factory=dict)  # source file -> digest, of what the stage runs

    @property
    def side_by_side(self) -> tuple[str, ...]:
        """The nodes (this one included) that the runner builds at the same time, each on its
        share of the cores. Part of the config, so that a model trained on a share is not taken
        for one trained on all the cores."""
        return tuple(self.config.get("side_by_side", ())) if isinstance(self.config, dict) else ()

    @property
    def default_id(self) -> str:
        return artifact_id(self.name, self.fingerprint)

    @property
    def id(self) -> str:
        return self.build or self.default_id

    @property
    def input_key(self) -> str:
        """What this node contributes to its dependants' fingerprints: its fingerprint, or the
        rebuild's id, so that what was built from one build is never taken for the other's."""
        return self.build or self.fingerprint


def build_graph(recipe: Recipe, recipe_path: str | Path, machine: dict | None = None) -> list[Node]:
    """All nodes the recipe asks for, in topological order, with fingerprints set.

    `machine` (cpu, gpu) enters the fingerprints of machine-dependent stages (benchmark, GPU-only
    evaluations) so that their numbers are never reused on another kind of machine.
    """
    where = str(recipe_path)
    nodes: list[Node] = []

    def add(name, stage, settings, inputs=None, extra=None, config=None):
        """`config`: what the fingerprint hashes, where it is not all of `settings`."""
        if config is None:
            config = dump_config(settings) if hasattr(settings, "model_dump") else settings
        if extra:
            config = {**(config or {}), **extra}
        nodes.append(Node(name, stage, config, dict(inputs or {}), settings))

    def need(section: str, by: str):
        if getattr(recipe, section) is None:
            raise RecipeError([f"{where}: {by}: needs a '{section}' section"])

    data_extra = _data_content(recipe)
    add("data", "data", recipe.data, extra=data_extra)
    imported = recipe.teacher is not None and recipe.teacher.pretrained is not None
    teachers_vocabulary = recipe.tokenizer is not None and recipe.tokenizer.kind == "teacher"
    if teachers_vocabulary and not imported:
        raise RecipeError([f"{where}: tokenizer.kind: teacher takes an imported teacher's vocabulary: it needs "
                           "teacher.pretrained"])
    if recipe.tokenizer is not None and not teachers_vocabulary:
        add("tokenizer", "tokenizer", recipe.tokenizer, {"data": "data"})

    models: list[str] = []
    if imported:
        _check_imported_teacher(recipe, where)
        pretrained = recipe.teacher.pretrained
        content = _checkpoint_content(pretrained)
        # A local checkpoint is identified by its files' digests, not by where it lies.
        config = {**dump_config(pretrained), "path": None} if "file_digests" in content else None
        add("teacher", "import_teacher", pretrained, extra={"checkpoint": content}, config=config)
        models.append("teacher")
        if teachers_vocabulary:
            add("tokenizer", "tokenizer", recipe.tokenizer, {"data": "data", "teacher": "teacher"})
    elif recipe.teacher is not None:
        need("tokenizer", "teacher")
        add("teacher", "train", TrainNode(role="teacher", model=recipe.teacher.model, train=recipe.teacher.train),
            {"data": "data", "tokenizer": "tokenizer"})
        models.append("teacher")

    if recipe.distill is not None:
        need("teacher", "distill")
        d = recipe.distill
        add("kd_corpus", "kd_corpus", d.corpus, {"data": "data", "teacher": "teacher"})
        inputs = {"data": "data", "tokenizer": "tokenizer", "kd_corpus": "kd_corpus"}
        if d.student.word_level.enabled or d.student.embeddings_from_teacher:
            inputs["teacher"] = "teacher"
        asked = [key for key, on in (("distill.student.embeddings_from_teacher", d.student.embeddings_from_teacher),
                                     ("distill.ablation_embeddings_from_teacher",
                                      d.ablation and d.ablation_embeddings_from_teacher)) if on]
        if asked and not imported and d.student.model.d_model > recipe.teacher.model.d_model:
            raise RecipeError([f"{where}: {' and '.join(asked)}: the student's d_model "
                               f"({d.student.model.d_model}) is wider than the teacher's "
                               f"({recipe.teacher.model.d_model}); there is nothing to project"])
        add("student", "train", TrainNode(role="student", **dict(d.student)), inputs)
        models.append("student")
        if d.ablation:
            shape = d.student.model
            if d.ablation_dropout is not None:
                shape = shape.model_copy(update={"dropout": d.ablation_dropout})
            reference_only = TrainNode(role="student_ref", model=shape, train=d.student.train, budget=d.ablation_budget,
                                       embeddings_from_teacher=d.ablation_embeddings_from_teacher)
            ref_inputs = {"data": "data", "tokenizer": "tokenizer"}
            if d.ablation_budget == "student_steps":
                ref_inputs["steps_of"] = "student"
            if d.ablation_embeddings_from_teacher:
                ref_inputs["teacher"] = "teacher"
            add("student_ref", "train", reference_only, ref_inputs)
            models.append("student_ref")
            if d.ablation_budget == "side_by_side":
                _side_by_side([n for n in nodes if n.name in ("student", "student_ref")])

    if recipe.prune is not None:
        if not models:
            raise RecipeError([f"{where}: prune: needs a model to prune (a 'teacher' or 'distill' section)"])
        source = "student" if "student" in models else "teacher"
        inputs = {"data": "data", "model": source}
        if "kd_corpus" in _names(nodes):
            inputs["kd_corpus"] = "kd_corpus"
        add("pruned", "prune", recipe.prune, inputs)
        models.append("pruned")

    final_model = next((m for m in ("pruned", "student", "teacher") if m in models), None)

    exports: list[str] = []
    if recipe.export is not None:
        if final_model is None:
            raise RecipeError([f"{where}: export: needs a model (a 'teacher' section at least)"])
        export_config = dump_config(recipe.export)
        export_config.pop("also")
        for model in [m for m in MODEL_NODES if m in recipe.export.also or m == final_model]:
            if model not in models:
                raise RecipeError([f"{where}: export.also: '{model}' is not built by this recipe"])
            add(f"export.{model}", "export", recipe.export, {"data": "data", "model": model}, config=export_config)
            exports.append(model)

    if recipe.quantize is not None:
        need("export", "quantize")
        add("quantize", "quantize", recipe.quantize,
            {"data": "data", "export": f"export.{final_model}"})

    has_cuda = bool((machine or {}).get("gpu"))
    variants = _variants(recipe, models, exports, final_model, has_cuda)

    if recipe.evaluate is not None:
        if not models:
            raise RecipeError([f"{where}: evaluate: needs a model (a 'teacher' section at least)"])
        for variant in (v for v in variants if not v.get("skipped")):
            settings = EvaluateNode(**recipe.evaluate.model_dump(), variant=variant["variant"],
                                    package=variant["package"], runtime=variant["runtime"], device=variant["device"],
                                    machine=machine if variant["device"] == "cuda" else None)
            add(f"evaluate.{variant['name']}", "evaluate", settings, {"data": "data", "model": variant["node"]})

    if recipe.benchmark is not None:
        if not models:
            raise RecipeError([f"{where}: benchmark: needs a model (a 'teacher' section at least)"])
        inputs = {"data": "data"}
        for variant in variants:
            inputs[variant["name"]] = variant["node"]
        add("benchmark", "benchmark", BenchmarkNode(**recipe.benchmark.model_dump(), variants=variants,
                                                    final_model=final_model, machine=machine), inputs)

    if recipe.report is not None:
        need("evaluate", "report")
        need("benchmark", "report")
        inputs = {"benchmark": "benchmark", "data": "data"}  # data: the references, for BLEU's uncertainty
        for variant in (v for v in variants if not v.get("skipped")):
            inputs[f"evaluate.{variant['name']}"] = f"evaluate.{variant['name']}"
        for model in models:  # how each was trained: steps, precision, whether a time cap cut it
            inputs[f"trained.{model}"] = model
        add("report", "report", ReportNode(**recipe.report.model_dump(), recipe=recipe.name), inputs)

    _check_and_fingerprint(nodes, where)
    return nodes


def _variants(recipe, models, exports, final_model, has_cuda) -> list[dict]:
    """What gets evaluated and benchmarked: each model in PyTorch, each ONNX package in ORT."""
    out = []
    for model in models:
        out.append(dict(name=model, variant=model, node=model, package=None, runtime="torch",
                        device="cpu", compute_type="float32"))
    for model in exports:
        out.append(dict(name=f"{model}_onnx", variant=model, node=f"export.{model}", package="fp32",
                        runtime="onnxruntime", device="cpu", compute_type="float32"))
    if recipe.export is not None and recipe.export.fp16:
        out.append(dict(name="fp16", variant="fp16", node=f"export.{final_model}", package="fp16",
                        runtime="onnxruntime", device="cuda", compute_type="float16",
                        skipped=None if has_cuda else "no CUDA device on this machine"))
    if recipe.quantize is not None:
        for kind, on in (("int8_dynamic", recipe.quantize.dynamic), ("int8_static", recipe.quantize.static)):
            if on:
                out.append(dict(name=kind, variant=kind, node="quantize", package=kind,
                                runtime="onnxruntime", device="cpu", compute_type="int8"))
    # A GPU-only variant is evaluated only where a GPU is; elsewhere the report says why not.
    return out


def _side_by_side(group: list[Node]) -> None:
    names = [n.name for n in group]
    for node in group:
        node.settings = node.settings.model_copy(update={"side_by_side": names})
        node.config = dump_config(node.settings)


def _names(nodes: list[Node]) -> set[str]:
    return {n.name for n in nodes}


def _check_and_fingerprint(nodes: list[Node], where: str) -> None:
    by_name: dict[str, Node] = {}
    for node in nodes:
        if node.stage not in STAGES:
            raise RecipeError([f"{where}: internal: unknown stage kind {node.stage!r}"])
        for role, upstream in node.inputs.items():
            if upstream not in by_name:
                raise RecipeError([f"{where}: {node.name}: needs '{upstream}', which this recipe does not build"])
        _set_fingerprint(node, by_name)
        by_name[node.name] = node


def _set_fingerprint(node: Node, by_name: dict[str, Node]) -> None:
    node.code = stage_code(STAGES[node.stage].module)
    node.fingerprint = fingerprint(node.name, STAGES[node.stage].version, combined(node.code), node.config,
                                   {role: by_name[up].input_key for role, up in node.inputs.items()})


def resolve_builds(nodes: list[Node], current_build: Callable[[str], str],
                   rebuild: Callable[[Node], str | None] = lambda node: None) -> None:
    """Point each node at the build of its fingerprint that the store holds now.

    A forced rebuild never overwrites an artifact: it is written under an id of its own and the
    store remembers it as the current build of that fingerprint (`current_build`: default id ->
    current id). Dependants then take the rebuild's id into their fingerprints, so nothing built
    from the earlier build is reused with the new one. `rebuild(node)` gives the id for a node
    this run rebuilds (None: keep the current one), called after its inputs are resolved."""
    by_name: dict[str, Node] = {}
    for node in nodes:  # topological order
        _set_fingerprint(node, by_name)
        current = current_build(node.default_id)
        node.build = "" if current == node.default_id else current  # rebuild(node) reads node.id
        node.build = rebuild(node) or node.build
        by_name[node.name] = node


def select(nodes: list[Node], until: str | None) -> list[Node]:
    """`until` a node name (`evaluate.teacher`) or a stage kind/prefix (`evaluate`): those nodes
    and everything they depend on."""
    if until is None:
        return list(nodes)
    targets = [n for n in nodes if n.name == until or n.stage == until or n.name.startswith(until + ".")]
    if not targets:
        names = ", ".join(dict.fromkeys([n.name.split(".")[0] for n in nodes] + [n.name for n in nodes]))
        raise UserInputError(f"--until {until}: no such stage in this recipe (stages: {names})")
    by_name = {n.name: n for n in nodes}
    wanted: set[str] = set()
    stack = [t.name for t in targets]
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(by_name[name].inputs.values())
    return [n for n in nodes if n.name in wanted]


def _check_imported_teacher(recipe: Recipe, where: str) -> None:
    """What an imported teacher cannot do here, each refused in one line: it has its own
    vocabulary (no word-level KD, no embedding to project), and our export, pruning and
    Seq-Inter selection read our model format."""
    d, problems = recipe.distill, []
    shared = recipe.tokenizer is not None and recipe.tokenizer.kind == "teacher"
    adopt = "or give the student the teacher's (tokenizer: {kind: teacher})"
    if d is not None and d.student.word_level.enabled and not shared:
        problems.append("distill.student.word_level: word-level distillation needs one vocabulary for teacher and "
                        f"student; an imported teacher has its own: use sequence-level KD alone, {adopt}")
    elif d is not None and d.student.word_level.enabled and not d.student.word_level.from_kd_corpus:
        problems.append("distill.student.word_level: an imported teacher is not run in the training loop: set "
                        "from_kd_corpus: true (its distributions kept by the KD corpus, distill.corpus.top_k)")
    for key, on in (("distill.student.embeddings_from_teacher", d is not None and d.student.embeddings_from_teacher),
                    ("distill.ablation_embeddings_from_teacher", d is not None and d.ablation
                     and d.ablation_embeddings_from_teacher)):
        if on and not shared:
            problems.append(f"{key}: an imported teacher's embedding is in its own vocabulary; drop it, {adopt}")
    if d is not None and d.corpus.top_k is not None and not shared:
        problems.append(f"distill.corpus.top_k: stored distributions are in the teacher's vocabulary; drop it, {adopt}")
    if d is not None and d.corpus.selection != "top":
        problems.append("distill.corpus.selection: only 'top' for an imported teacher")
    if d is None and recipe.prune is not None:
        problems.append("prune: an imported teacher is not pruned here; distil a student from it (a 'distill' section)")
    if recipe.export is not None and ("teacher" in recipe.export.also or d is None):
        problems.append("export: an imported teacher is not exported here (CTranslate2 converts it as it is)")
    if problems:
        raise RecipeError([f"{where}: {p}" for p in problems])


def _checkpoint_content(pretrained) -> dict:
    """What identifies an imported teacher: the digests of a local checkpoint's files, or the
    hub id and revision (resolved when the stage runs)."""
    folder = Path(pretrained.path).expanduser()
    if not folder.is_dir():
        return {"hub_id": pretrained.path, "revision": pretrained.revision}
    try:  # the files an import copies, read as it reads them: never through a link
        return {"file_digests": file_digests(folder)}
    except (UnsafeCheckpoint, UnsafeFile) as exc:
        raise UserInputError(f"teacher.pretrained.path: {exc}") from None
    except OSError as exc:
        raise UserInputError(f"teacher.pretrained.path: cannot read {folder}: {exc.strerror}") from None


def _data_content(recipe: Recipe) -> dict:
    """What identifies the data's content, so the fingerprint follows it and not its location."""
    cfg = recipe.data
    if cfg.source == "multi30k":
        # The checksums pin the content; where the files were found does not matter.
        return {"data_dir": None, "url": None}
    digests = {}
    for split, spec in _file_specs(cfg.files):
        for key in ("src", "tgt", "tsv"):
            name = getattr(spec, key)
            if name is not None:
                digests[f"{split}.{key}"] = _file_digest(Path(name))
    return {"file_digests": digests}


def _file_specs(files):
    if isinstance(files.train, list):  # several weighted corpora: each one's files, by its name
        for corpus in files.train:
            yield f"train.{corpus.label}", corpus
    else:
        yield "train", files.train
    yield "valid", files.valid
    for name, spec in files.test.items():
        yield f"test.{name}", spec


def _file_digest(path: Path) -> str:
    try:
        h = hashlib.sha256()
        with os.fdopen(open_regular(path), "rb") as f:  # a fifo or a device is refused, never hashed
            while block := f.read(1 << 20):
                h.update(block)
        return h.hexdigest()
    except FileNotFoundError:
        raise UserInputError(f"data file not found: {path}") from None
    except IsADirectoryError:
        raise UserInputError(f"data file is a directory: {path}") from None
    except UnsafeFile as exc:
        raise UserInputError(f"data file {exc}; a data file must be a regular file") from None
    except OSError as exc:
        raise UserInputError(f"cannot read data file {path}: {exc.strerror}") from None
