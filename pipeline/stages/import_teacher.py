"""Import stage: a teacher the user already has, a Hugging Face sequence-to-sequence checkpoint
(a local folder, or a hub id where a network exists), copied into an artifact.

The artifact holds the checkpoint's files under checkpoint/ (their digests in the manifest, so
what follows is tied to these weights) and hf_import.json, which model_loading reads to open it
with transformers or CTranslate2. The plan's fingerprint takes the digests of a local folder's
files (pipeline/graph.py), so changed weights rebuild everything after it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from model.files import open_regular

from ..context import StageContext
from ..errors import UserInputError
from ..recipe import PretrainedTeacher

HF_IMPORT_FILE = "hf_import.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what model_bytes counts, as for our models
# Files a checkpoint folder holds that a translator never reads.
_SKIPPED = {".git", ".gitattributes", "README.md", "flax_model.msgpack", "tf_model.h5", "rust_model.ot"}


def run(ctx: StageContext) -> dict:
    cfg: PretrainedTeacher = ctx.settings
    from model.hf_translator import HF_EXTRA_HINT, NotSeq2Seq, checkpoint_config

    if importlib.util.find_spec("transformers") is None:
        raise UserInputError(HF_EXTRA_HINT)
    source = resolve_checkpoint(cfg)
    try:
        config = checkpoint_config(source)
    except NotSeq2Seq as exc:
        raise UserInputError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"teacher.pretrained.path: {source} is not a transformers checkpoint "
                             f"({str(exc).splitlines()[0][:200]})") from None
    dest = ctx.out / "checkpoint"
    dest.mkdir()
    copied = 0
    for path in sorted(source.iterdir()):
        if path.name in _SKIPPED or path.is_dir():
            continue
        with os.fdopen(open_regular(path), "rb") as src, open(dest / path.name, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        copied += path.stat().st_size
    from model.hf_translator import HFTranslator

    translator = HFTranslator(dest)  # loads: a checkpoint whose weights do not fit its config fails here
    (ctx.out / HF_IMPORT_FILE).write_text(json.dumps({
        "format": cfg.format, "source": cfg.path, "revision": cfg.revision, "model_type": config.model_type,
        "architectures": getattr(config, "architectures", None)}, indent=2) + "\n", encoding="utf-8")
    params = translator.num_parameters()
    weights = sum(p.stat().st_size for p in dest.iterdir() if p.name in WEIGHT_FILES)
    ctx.log(f"imported {config.model_type} checkpoint {cfg.path}: {params:,} parameters, {copied / 2**20:.1f} MB")
    return {"role": "teacher", "imported": True, "format": cfg.format, "source": cfg.path,
            "model_type": config.model_type, "params": params, "model_bytes": weights, "checkpoint_bytes": copied,
            "vocab_size": int(getattr(config, "vocab_size", 0) or 0)}


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
        raise UserInputError(f"teacher.pretrained.path: '{cfg.path}' is not a local folder and the Hugging Face hub "
                             "cannot be reached (no network?): download it where a network exists and give its "
                             "folder") from None
    except Exception as exc:  # the hub's own errors: unknown id, gated model, bad revision
        raise UserInputError(f"teacher.pretrained.path: '{cfg.path}': {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200]}") from None
