"""Import stage: a teacher the user already has, a Hugging Face sequence-to-sequence checkpoint
(a local folder, or a hub id where a network exists), copied, checked and loaded into an artifact
by pipeline/training/teacher_import.py. The plan's fingerprint takes the digests of a local
folder's files, and the import checks that the files copied are still those."""

from __future__ import annotations

from ...engine.context import StageContext
from ...training.teacher_import import import_checkpoint


def run(ctx: StageContext) -> dict:
    planned = ((ctx.config or {}).get("checkpoint") or {}).get("file_digests")
    return import_checkpoint(ctx.settings, ctx.out, planned, ctx.log)
