"""The tokenizer stage: a joint subword vocabulary for source and target, trained on the corpus, or
an imported teacher's own (build.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from model.sizes import MAX_VOCAB

from ...engine.recipe import PositiveInt, Strict
from ...engine.stage import Inputs, Output, Planner, Section, Stage
from ...engine.store import Artifact


class TokenizerConfig(Strict):
    # unigram, bpe: trained here on the corpus. teacher: an imported teacher's own vocabulary, as
    # it is (word-level distillation and its embedding then carry over to the student).
    kind: Literal["unigram", "bpe", "teacher"] = "unigram"
    vocab_size: Annotated[int, Field(ge=64, le=MAX_VOCAB)] = 8000
    # Sentences sampled from the training split to train the tokenizer (all if null).
    max_sentences: PositiveInt | None = None

    @model_validator(mode="after")
    def _teacher_vocabulary_is_not_trained(self):
        if self.kind == "teacher" and {"vocab_size", "max_sentences"} & self.model_fields_set:
            raise ValueError(
                "kind: teacher takes the imported teacher's vocabulary as it is: drop vocab_size and max_sentences"
            )
        return self


@dataclass(frozen=True)
class TokenizerInputs(Inputs):
    data: Artifact
    teacher: Artifact | None = None  # an imported teacher, whose vocabulary is taken (kind: teacher)


@dataclass(frozen=True)
class TokenizerOutput(Output):
    vocab_size: int
    kind: str
    special_ids: dict[str, int]
    valid_round_trip_exact: float  # validation targets that decode back to themselves
    valid_src_tokens_per_sentence: float
    valid_src_unk_rate: float
    valid_tgt_tokens_per_sentence: float
    valid_tgt_unk_rate: float
    target_side: bool | None = None  # kind teacher: whether the teacher has a tokenizer per side
    teacher: str | None = None  # kind teacher: the imported teacher's artifact


def plan(p: Planner) -> None:
    cfg = p.recipe.tokenizer
    if cfg is None:
        return
    if cfg.kind != "teacher":
        p.add("tokenizer", cfg, {"data": "data"})
        return
    if p.recipe.teacher is None or p.recipe.teacher.pretrained is None:
        raise p.error("tokenizer.kind: teacher takes an imported teacher's vocabulary: it needs teacher.pretrained")
    p.add("tokenizer", cfg, {"data": "data", "teacher": "teacher"})


STAGE = Stage(
    "tokenizer",
    1,
    "train the joint subword tokenizer",
    settings=TokenizerConfig,
    inputs=TokenizerInputs,
    plan=plan,
    build="pipeline.stages.tokenizer.build",
    output=TokenizerOutput,
    sections=(Section("tokenizer", TokenizerConfig),),
    headline=("vocab_size",),
)
