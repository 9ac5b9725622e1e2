"""What a stage is, declared in one place: pipeline/stages/<kind>/__init__.py holds a `STAGE`, and
the registry (pipeline/stages/__init__.py) is the ordered list of them.

A declaration says what the stage is handed (`settings`, a typed model: ctx.settings), what it
reads (`inputs`, a frozen dataclass of artifacts: ctx.inputs), which recipe sections it owns
(`sections`), what its `run(ctx)` returns (`output`, a frozen dataclass of the metrics the
manifest keeps: the runner refuses a key it lacks), how it plans its nodes from a recipe (`plan`,
given a Planner), where its `run(ctx)` is (`build`, a module imported only when one of its nodes
is built, so that planning a run never imports torch), and how its metrics read (`headline`, the
figures the run's summary shows; `cut`, the metrics that say a time cap cut a training). The engine
knows no stage by name, nor any stage's metric: the registry is handed to it.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

from pydantic import BaseModel

from .errors import PipelineError, RecipeError, StageFailed
from .recipe import Strict, dump_config
from .store import Artifact, artifact_id


@dataclass(frozen=True)
class Section:
    """A recipe section a stage owns: its key, its schema and its value where a recipe leaves it
    out (None: the stage does not run)."""

    key: str
    model: type[BaseModel]
    default: Any = None


@dataclass(frozen=True)
class Inputs:
    """Base of a stage's inputs: one field per role. A field without a default is a required
    artifact; `X | None = None` an optional one; `dict[str, Artifact] = field(default_factory=dict)`
    any number of them, under the roles `<field>.<key>`."""

    @classmethod
    def _fields(cls) -> dict[str, str]:
        """field -> "required", "optional" or "many"."""
        kinds = {}
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING:
                kinds[f.name] = "many"
            elif f.default is dataclasses.MISSING:
                kinds[f.name] = "required"
            else:
                kinds[f.name] = "optional"
        return kinds

    @classmethod
    def problems(cls, roles: list[str]) -> list[str]:
        """What is wrong with a node that reads these roles: unknown roles, required ones missing."""
        kinds = cls._fields()
        unknown = [
            r
            for r in roles
            if (kinds.get(r.partition(".")[0]) == "many") != ("." in r) or ("." not in r and r not in kinds)
        ]
        missing = [name for name, kind in kinds.items() if kind == "required" and name not in roles]
        return [f"unknown input {r!r}" for r in unknown] + [f"input {name!r} missing" for name in missing]

    @classmethod
    def of(cls, artifacts: dict[str, Artifact]) -> Inputs:
        """The inputs from {role: artifact}."""
        values: dict[str, Any] = {}
        for name, kind in cls._fields().items():
            if kind == "many":
                values[name] = {
                    role.partition(".")[2]: a
                    for role, a in artifacts.items()
                    if role.partition(".")[0] == name and "." in role
                }
            elif name in artifacts:
                values[name] = artifacts[name]
        return cls(**values)


@dataclass(frozen=True)
class Output:
    """Base of a stage's output: one field per key of the metrics its run(ctx) returns (and the
    manifest stores as returned), a field with a default for a key that is not always there.
    `EXTRA`, where set, matches keys named after something a recipe names (a test set's
    `<name>_pairs`): they are kept in `extra`. Other stages read an artifact's metrics through
    `of`, so that a renamed key fails where it is read, not in a report that shows None."""

    EXTRA: ClassVar[re.Pattern | None] = None

    @classmethod
    def problems(cls, metrics: dict) -> list[str]:
        """Keys the declaration lacks, then required keys the metrics lack."""
        fields = [f for f in dataclasses.fields(cls) if f.name != "extra"]
        unknown = [
            k for k in metrics if k not in {f.name for f in fields} and not (cls.EXTRA and cls.EXTRA.fullmatch(str(k)))
        ]
        missing = [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in metrics
        ]
        return [f"key {k!r} is not in {cls.__name__}" for k in unknown] + [
            f"key {k!r} of {cls.__name__} is missing" for k in missing
        ]

    @classmethod
    def of(cls, metrics: dict, what: str = "metrics"):
        """The typed view of an artifact's metrics (`what`: its id, for the error, one line)."""
        if problems := cls.problems(metrics):
            raise StageFailed(f"{what}: {problems[0]}")
        named = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in metrics.items() if k in named}
        if "extra" in named:
            values["extra"] = {k: v for k, v in metrics.items() if k not in named}
        return cls(**values)


class Variant(Strict):
    """One thing the recipe evaluates and benchmarks: a model in PyTorch, or one of its ONNX
    packages in onnxruntime. `node` holds it (`package`: the folder inside that artifact),
    `source` is the PyTorch model it was made from (its parameters and heads), and `skipped` says
    why it is not measured on this machine (a GPU-only variant without a GPU)."""

    name: str  # unique: "student", "pruned_onnx", "int8_dynamic"
    variant: str  # the model or the package variant
    node: str
    source: str
    package: str | None = None
    runtime: Literal["torch", "onnxruntime", "ctranslate2", "optimum"] = "torch"
    device: Literal["cpu", "cuda"] = "cpu"
    compute_type: str = "float32"
    skipped: str | None = None

    @classmethod
    def model(cls, name: str) -> Variant:
        """A PyTorch model as it was trained."""
        return cls(name=name, variant=name, node=name, source=name)


@dataclass(frozen=True)
class Stage:
    kind: str  # what the manifests call it: "train"
    version: int  # bump to rebuild what the code digest cannot see (a dependency's behaviour)
    summary: str
    settings: type  # what a node is handed (ctx.settings)
    inputs: type[Inputs]  # what a node reads (ctx.inputs)
    plan: Callable[[Planner], None]  # adds the stage's nodes for a recipe
    build: str  # the module whose run(ctx) builds a node's artifact
    output: type[Output]  # what run(ctx) returns: the metrics its manifest keeps
    sections: tuple[Section, ...] = ()
    # Metrics the run's summary shows for a node built (at most four, in the metrics' order).
    headline: tuple[str, ...] = ()
    # Metrics that, when set, say a time cap cut a training short ("cut by time at step N of M"):
    # `status` flags the node and what was built from it. "a.b" is a nested key, "a[].b" the key
    # in each item of the list a.
    cut: tuple[str, ...] = ()

    @property
    def declaration(self) -> str:
        """The module that declares the stage (the build module's package)."""
        return self.build.rpartition(".")[0]

    def cut_reason(self, metrics: dict) -> str | None:
        """What cut the training short, from the metrics `cut` names; None when nothing did."""
        found = [value for path in self.cut for value in _values(metrics, path.split("."))]
        return "; ".join(v for v in found if isinstance(v, str) and v) or None

    def load(self) -> Callable:
        """The stage's run function (importing its code)."""
        try:
            module = importlib.import_module(self.build)
        except ModuleNotFoundError as exc:
            if exc.name == self.build:
                raise PipelineError(f"stage '{self.kind}' is not implemented yet ({self.summary})") from None
            raise
        return module.run


def _values(data: Any, keys: list[str]) -> list[Any]:
    """The values at a `Stage.cut` path ("a[].b": b in each item of the list a)."""
    if not keys:
        return [data]
    if not isinstance(data, dict):
        return []
    key, each = keys[0].removesuffix("[]"), keys[0].endswith("[]")
    if each:
        items = data.get(key)
        return [v for item in items for v in _values(item, keys[1:])] if isinstance(items, list) else []
    return _values(data[key], keys[1:]) if key in data else []


@dataclass
class Node:
    name: str  # unique in the graph: "teacher", "evaluate.int8_dynamic"
    spec: Stage  # the stage whose code runs
    config: Any  # plain data (JSON-able); hashed into the fingerprint
    inputs: dict[str, str] = field(default_factory=dict)  # role -> upstream node name
    settings: Any = None  # the typed config object handed to the stage
    fingerprint: str = ""
    build: str = ""  # a forced rebuild's artifact id; "" for the build the fingerprint names
    code: dict[str, str] = field(default_factory=dict)  # source file -> digest, of what the stage runs
    # What an earlier build of this artifact id chose by measuring the machine, from the recipe's
    # lock file (engine/lockfile.py: choices): handed to the build as ctx.recorded.
    recorded: dict | None = None

    @property
    def stage(self) -> str:
        return self.spec.kind

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


class Planner:
    """What a stage's `plan` is handed: the recipe, the machine, what earlier stages planned
    (nodes, models, variants), and `add` for its own nodes. Stages plan in the registry's order."""

    def __init__(self, recipe: Any, where: str, machine: dict | None = None):
        self.recipe, self.where, self.machine = recipe, where, machine
        self.nodes: list[Node] = []
        self.models: list[str] = []  # model nodes, in the order planned
        self.variants: list[Variant] = []  # what evaluate and benchmark measure, in report order
        self.stage: Stage | None = None  # the stage planning now
        self._finals: list[str] = []

    @property
    def has_cuda(self) -> bool:
        return bool((self.machine or {}).get("gpu"))

    @property
    def final_model(self) -> str | None:
        """The model the chain ends with (the last one planned as `final`): what is exported,
        quantized and shipped."""
        return self._finals[-1] if self._finals else None

    def planned(self, name: str) -> bool:
        return any(n.name == name for n in self.nodes)

    def add(
        self,
        name: str,
        settings: Any,
        inputs: dict[str, str] | None = None,
        *,
        config: Any = None,
        extra: dict | None = None,
        model: bool = False,
        final: bool = True,
    ) -> Node:
        """A node of the planning stage. `config`: what the fingerprint hashes, where it is not all
        of `settings`; `extra`: added to it. `model`: a PyTorch model (a variant of its own, and
        the final model unless `final` is false)."""
        if config is None:
            config = dump_config(settings) if hasattr(settings, "model_dump") else settings
        if extra:
            config = {**(config or {}), **extra}
        node = Node(name, self.stage, config, dict(inputs or {}), settings)
        self.nodes.append(node)
        if model:
            self.models.append(name)
            self.variants.append(Variant.model(name))
            if final:
                self._finals.append(name)
        return node

    def error(self, *problems: str) -> RecipeError:
        return RecipeError([f"{self.where}: {p}" for p in problems])

    def need(self, section: str, by: str) -> None:
        if getattr(self.recipe, section) is None:
            raise self.error(f"{by}: needs a '{section}' section")
