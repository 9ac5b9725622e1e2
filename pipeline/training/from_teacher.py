"""What a student takes from its teacher besides the KD corpus: the teacher itself, with the
student's vocabulary (word-level distillation), and its input embedding as the student's start
(embeddings_from_teacher), projected to the student's width."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from mt_runtime.subword import SubwordTokenizer

from model.transformer import Transformer, load_model

from ..engine.errors import UserInputError
from ..measure.translators import is_imported_teacher


def teacher_with_our_vocabulary(teacher: Path, tokenizer: SubwordTokenizer, device: str, why: str) -> Transformer:
    """The teacher model folder's model, on `device`; an error where its vocabulary is not ours
    (`why`: what needs the two to share one)."""
    teacher_tok = SubwordTokenizer.load(teacher / "tokenizer.json")
    if teacher_tok.tok.get_vocab() != tokenizer.tok.get_vocab():
        raise UserInputError(
            f"{why} needs the teacher and student to share one vocabulary; "
            "the teacher's tokenizer differs from this recipe's"
        )
    return load_model(teacher, device)


def teacher_token_table(teacher: Path, tokenizer: SubwordTokenizer) -> torch.Tensor:
    """The teacher's [vocab, d_model] input embedding, in the student's ids: an imported teacher's
    is in its vocabulary, which the student has taken (tokenizer: {kind: teacher}, checked by the plan)."""
    if is_imported_teacher(teacher):
        from model.hf_checkpoint import from_pretrained
        from model.hf_translator import require_transformers

        model = from_pretrained(require_transformers().AutoModelForSeq2SeqLM, teacher / "checkpoint", weights=True)
        return model.get_input_embeddings().weight.detach()
    return teacher_with_our_vocabulary(teacher, tokenizer, "cpu", "embeddings_from_teacher").token_table()


def project_embedding(weight: torch.Tensor, d_model: int, std: float) -> tuple[torch.Tensor, float]:
    """The rows of `weight` [vocab, D] on its top d_model right singular vectors, scaled to `std`:
    the best rank-d_model approximation of the words' dot products (which the tied output
    projection scores with). Returns the new table and the fraction of variance it keeps."""
    if d_model > weight.shape[1]:
        raise UserInputError(
            f"embeddings_from_teacher: the student (d_model {d_model}) is wider than the "
            f"teacher ({weight.shape[1]}); nothing to project"
        )
    w = weight.detach().float().cpu()
    _, singular, vh = torch.linalg.svd(w, full_matrices=False)
    projected = w @ vh[:d_model].T
    kept = float((singular[:d_model] ** 2).sum() / (singular**2).sum())
    return projected * (std / float(projected.std())), kept


def embedding_from_teacher(model: Transformer, table: torch.Tensor, log: Callable[[str], None]) -> dict:
    """Start `model`'s input embedding from the teacher's `table` (teacher_token_table), projected
    to its width; returns what the training's metrics record of it."""
    width = model.embed.weight.shape[1]  # embed_dim where the table is factorised
    # An imported teacher's vocabulary may lack our <s>: that row keeps its initialisation.
    rows = min(len(table), len(model.embed.weight))
    with torch.no_grad():
        projected, kept = project_embedding(table[:rows], width, float(model.embed.weight.std()))
        model.embed.weight[:rows].copy_(projected)
    log(
        f"embedding: the teacher's, on its top {width} of {table.shape[1]} principal "
        f"directions ({kept:.1%} of its variance)"
    )
    return {"teacher_d_model": table.shape[1], "variance_kept": round(kept, 4)}
