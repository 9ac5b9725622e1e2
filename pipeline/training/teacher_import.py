"""Importing a teacher the user already has, a Hugging Face sequence-to-sequence checkpoint
(a local folder, or a hub id where a network exists), copied into an artifact.

The artifact holds the checkpoint's files under checkpoint/ (their digests in the manifest, so
what follows is tied to these weights) and hf_import.json, which model_loading reads to open it
with transformers or CTranslate2. The plan's fingerprint takes the digests of a local folder's
files (pipeline/engine/graph.py), so changed weights rebuild everything after it.

The checkpoint is untrusted data (model/hf_checkpoint.py): checked before anything opens it (no
link, no custom code, no pickle-only weights, sizes that fit), copied as regular files with no
wider permissions than its own and hashed as copied, checked again as copied, and only then
opened by transformers.

The import_teacher stage (pipeline/stages/import_teacher/) wires this module.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from model.hf_checkpoint import UnsafeCheckpoint, check_checkpoint, copy_checkpoint

from ..engine.errors import UserInputError
from .settings import PretrainedTeacher

HF_IMPORT_FILE = "hf_import.json"


def import_checkpoint(cfg: PretrainedTeacher, out: Path, planned: dict | None, log) -> dict:
    """The checkpoint `cfg` names copied, checked and loaded into `out` (checkpoint/ and
    hf_import.json), `planned`: its files' digests when the run was planned (None: a hub id).
    Returns what the import_teacher stage returns."""
    from model.hf_translator import HF_EXTRA_HINT, NotSeq2Seq, checkpoint_config

    if importlib.util.find_spec("transformers") is None:
        raise UserInputError(HF_EXTRA_HINT)
    source = resolve_checkpoint(cfg)
    dest = out / "checkpoint"
    dest.mkdir()
    try:
        digests = copy_checkpoint(source, dest)  # checks the folder before a byte is copied
        if planned is not None and planned != digests:
            changed = sorted(set(planned.items()) ^ set(digests.items()))[0][0]
            raise UnsafeCheckpoint(f"{source / changed} changed since the run was planned; run again")
        check_checkpoint(dest)  # what transformers will read is what was checked
        config = checkpoint_config(dest)
    except (NotSeq2Seq, UnsafeCheckpoint) as exc:
        raise UserInputError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise UserInputError(
            f"teacher.pretrained.path: {source} is not a transformers checkpoint ({str(exc).splitlines()[0][:200]})"
        ) from None
    copied = sum(p.stat().st_size for p in dest.iterdir())
    from model.hf_translator import HFTranslator

    try:
        translator = HFTranslator(dest)  # loads: a checkpoint whose weights do not fit its config fails here
    except (OSError, ValueError, RuntimeError) as exc:
        raise UserInputError(
            f"teacher.pretrained.path: transformers cannot load {source}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}"
        ) from None
    (out / HF_IMPORT_FILE).write_text(
        json.dumps(
            {
                "format": cfg.format,
                "source": cfg.path,
                "revision": cfg.revision,
                "model_type": config.model_type,
                "architectures": getattr(config, "architectures", None),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    params = translator.num_parameters()
    weights = sum(p.stat().st_size for p in dest.iterdir() if p.name.endswith(".safetensors"))
    log(f"imported {config.model_type} checkpoint {cfg.path}: {params:,} parameters, {copied / 2**20:.1f} MB")
    return {
        "role": "teacher",
        "imported": True,
        "format": cfg.format,
        "source": cfg.path,
        "model_type": config.model_type,
        "params": params,
        "model_bytes": weights,
        "checkpoint_bytes": copied,
        "vocab_size": int(getattr(config, "vocab_size", 0) or 0),
    }


def resolve_checkpoint(cfg: PretrainedTeacher) -> Path:
    """A local checkpoint folder as given, else the hub id downloaded (or found in the hub cache)."""
    local = Path(cfg.path).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise UserInputError(f"teacher.pretrained.path: {local} is not a checkpoint folder (no config.json)")
        return local
    if cfg.path.startswith((".", "/", "~")) or cfg.path.count("/") > 1:
        raise UserInputError(f"teacher.pretrained.path: {cfg.path}: no such folder")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        from model.hf_translator import HF_EXTRA_HINT

        raise UserInputError(HF_EXTRA_HINT) from None
    try:
        return Path(snapshot_download(cfg.path, revision=cfg.revision))
    except LocalEntryNotFoundError:
        raise UserInputError(
            f"teacher.pretrained.path: '{cfg.path}' is not a local folder and the Hugging Face hub "
            "cannot be reached (no network?): download it where a network exists and give its "
            "folder"
        ) from None
    except Exception as exc:  # the hub's own errors: unknown id, gated model, bad revision
        raise UserInputError(
            f"teacher.pretrained.path: '{cfg.path}': {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        ) from None
