"""The import_teacher stage: a teacher the user already has, a Hugging Face sequence-to-sequence
checkpoint, copied into an artifact (build.py). Planned where the recipe's `teacher` section has
`pretrained` (pipeline/training/settings.py); the fingerprint takes the digests of a local
checkpoint's files, so other weights rebuild everything after it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mt_runtime.files import UnsafeFile

from model.hf_checkpoint import UnsafeCheckpoint, file_digests

from ...engine.errors import RecipeError, UserInputError
from ...engine.recipe import dump_config
from ...engine.stage import Inputs, Output, Planner, Stage
from ...training.settings import PretrainedTeacher


@dataclass(frozen=True)
class ImportInputs(Inputs):
    """None: the checkpoint is the recipe's (its files' digests are in the config)."""


@dataclass(frozen=True)
class ImportOutput(Output):
    """The keys every model artifact has (role, params, model_bytes) and where it came from."""

    role: str  # teacher
    imported: bool  # True: what the report, the benchmark and translate tell an imported teacher by
    format: str
    source: str  # the folder or hub id
    model_type: str  # transformers' (marian, ...)
    params: int
    model_bytes: int  # its *.safetensors
    checkpoint_bytes: int  # every file copied
    vocab_size: int


def plan(p: Planner) -> None:
    teacher = p.recipe.teacher
    if teacher is None or teacher.pretrained is None:
        return
    _check_imported_teacher(p.recipe, p.where)
    pretrained = teacher.pretrained
    content = _checkpoint_content(pretrained)
    # A local checkpoint is identified by its files' digests, not by where it lies.
    config = {**dump_config(pretrained), "path": None} if "file_digests" in content else None
    p.add("teacher", pretrained, extra={"checkpoint": content}, config=config, model=True)


def _check_imported_teacher(recipe, where: str) -> None:
    """What an imported teacher cannot do here, each refused in one line: it has its own
    vocabulary (no word-level KD, no embedding to project), and our export, pruning and
    Seq-Inter selection read our model format."""
    d, problems = recipe.distill, []
    shared = recipe.tokenizer is not None and recipe.tokenizer.kind == "teacher"
    adopt = "or give the student the teacher's (tokenizer: {kind: teacher})"
    if d is not None and d.student.word_level.enabled and not shared:
        problems.append(
            "distill.student.word_level: word-level distillation needs one vocabulary for teacher and "
            f"student; an imported teacher has its own: use sequence-level KD alone, {adopt}"
        )
    elif d is not None and d.student.word_level.enabled and not d.student.word_level.from_kd_corpus:
        problems.append(
            "distill.student.word_level: an imported teacher is not run in the training loop: set "
            "from_kd_corpus: true (its distributions kept by the KD corpus, distill.corpus.top_k)"
        )
    for key, on in (
        ("distill.student.embeddings_from_teacher", d is not None and d.student.embeddings_from_teacher),
        (
            "distill.ablation_embeddings_from_teacher",
            d is not None and d.ablation and d.ablation_embeddings_from_teacher,
        ),
    ):
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


STAGE = Stage(
    "import_teacher",
    1,
    "import a Hugging Face seq2seq checkpoint",
    settings=PretrainedTeacher,
    inputs=ImportInputs,
    plan=plan,
    build="pipeline.stages.import_teacher.build",
    output=ImportOutput,
    headline=("params", "vocab_size"),
)
