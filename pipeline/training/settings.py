"""What to train and from what: the recipe's `teacher` and `distill` sections, read by the train,
import_teacher and kd_corpus stages, and the model and training settings the training loop takes
(TrainConfig) and pruning's fine-tune shares (Bf16)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_serializer, model_validator

from model.sizes import MAX_DIM, MAX_LAYERS, size_problem

from ..engine.recipe import Fraction, NonNegInt, OpenFraction, PositiveFloat, PositiveInt, Seed, Strict

Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]
Layers = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
# bf16 autocast. auto: where the GPU supports it, and on a CPU where a probe at the model's shapes
# measures it faster than float32 (pipeline/training/speed_probe.py); on: always (a warning gives the
# measured slowdown where it is slower); off: float32. YAML 1.1 reads a bare on/off as a
# boolean; the user meant the word.
Bf16 = Annotated[
    Literal["auto", "on", "off"],
    BeforeValidator(lambda v: {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v),
]


class ModelSpec(Strict):
    """Architecture. Heads and FFN width may be lists (one value per layer), as pruning leaves them."""

    d_model: Dim = 256
    encoder_layers: Layers = 3
    decoder_layers: Layers = 3
    heads: Layers = 4
    head_dim: Dim = 64
    ffn_dim: Dim = 1024
    dropout: OpenFraction = 0.1
    attention_dropout: OpenFraction = 0.0
    activation: Literal["relu", "gelu"] = "relu"
    pre_ln: bool = False
    max_positions: Dim = 256
    # A factorised token table: vocab x embed_dim plus a projection to d_model, tied to the
    # output layer (below d_model; null: one vocab x d_model table). For small models, whose
    # parameters are half token table: the layers get the difference.
    embed_dim: Dim | None = None

    @model_validator(mode="after")
    def _narrower_table(self):
        if self.embed_dim is not None and self.embed_dim >= self.d_model:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be below d_model ({self.d_model})")
        return self

    @model_validator(mode="after")
    def _buildable(self):
        # The layers' parameters (the token table's depend on the tokenizer, checked when built).
        enc, dec = self.encoder_layers, self.decoder_layers
        problem = size_problem(
            self.d_model,
            self.head_dim,
            [self.heads] * enc,
            [self.heads] * dec,
            [self.heads] * dec,
            [self.ffn_dim] * enc,
            [self.ffn_dim] * dec,
            embed_dim=self.embed_dim,
            max_positions=self.max_positions,
        )
        if problem:
            raise ValueError(problem)
        return self

    @model_serializer(mode="wrap")
    def _unfactorised_as_before(self, handler):
        # Absent, not null, when unused: models configured before the field existed keep
        # their fingerprints (and their trained artifacts).
        data = handler(self)
        if data.get("embed_dim", 0) is None:
            del data["embed_dim"]
        return data


class TrainConfig(Strict):
    lr: PositiveFloat = 1e-3  # peak learning rate, reached at the end of warmup
    warmup_steps: NonNegInt = 800
    # Linear learning-rate cooldown to ~0 over the last fraction of the budget (0: none). With a
    # time or step budget the plain 1/sqrt tail leaves the rate high at the end; cooling it gives
    # a better final model for the same training time.
    cooldown: Fraction = 0.0
    batch_tokens: PositiveInt = 6000
    label_smoothing: OpenFraction = 0.1
    clip_norm: PositiveFloat | None = 1.0
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    # The budget: training stops at the first of these reached, and the schedule's cooldown
    # follows it. Steps and epochs mean the same model on every machine; at least one is needed.
    max_epochs: PositiveInt | None = 20
    max_steps: PositiveInt | None = None
    # A cap on wall-clock minutes, not a budget: a training it cuts short is recorded as cut
    # ("cut by time at step N of M") in its manifest, the run log, `status` and the report.
    max_minutes: PositiveFloat | None = None
    seed: Seed = 1
    # Validation each epoch: loss on all of valid, BLEU (greedy) on its first N sentences.
    valid_bleu_sentences: NonNegInt = 400
    # The saved model is the average of the best N epoch checkpoints by validation loss.
    average_checkpoints: PositiveInt = 1
    checkpoint_every_minutes: PositiveFloat = 2.0
    num_threads: PositiveInt | None = None  # torch intra-op threads; all cores if null
    bf16: Bf16 = "auto"

    @model_validator(mode="after")
    def _some_budget(self):
        if self.max_epochs is None and self.max_steps is None:
            cap = (
                " (max_minutes is a cap, not a budget: the same recipe would train a different model on each machine)"
                if self.max_minutes is not None
                else ""
            )
            raise ValueError(f"set a budget: max_steps or max_epochs{cap}")
        return self


class PretrainedTeacher(Strict):
    """A teacher imported, not trained: a Hugging Face AutoModelForSeq2SeqLM checkpoint."""

    format: Literal["huggingface"] = "huggingface"
    path: Annotated[str, Field(min_length=1, max_length=1000)]  # a checkpoint folder, or a hub id (network)
    revision: Annotated[str, Field(min_length=1, max_length=200)] | None = None  # of a hub id
    # What translates the KD corpus: CTranslate2 where its converter takes the model (auto), or
    # transformers' generate.
    decoder: Literal["auto", "ctranslate2", "transformers"] = "auto"


class TeacherConfig(Strict):
    model: ModelSpec = ModelSpec()
    train: TrainConfig = TrainConfig()
    pretrained: PretrainedTeacher | None = None

    @model_validator(mode="after")
    def _imported_or_trained(self):
        if self.pretrained is not None and {"model", "train"} & self.model_fields_set:
            raise ValueError(
                "an imported teacher (pretrained) is not trained here: drop teacher.model and teacher.train"
            )
        return self


class KDCorpusConfig(Strict):
    """Sequence-level KD: the teacher translates the training sources once."""

    beam: PositiveInt = 4
    length_penalty: Annotated[float, Field(ge=0)] = 1.0
    batch_tokens: PositiveInt = 6000
    max_sentences: PositiveInt | None = None  # translate only the first N (small recipes)
    # Which of the teacher's beam hypotheses becomes the student's target. top: its best (Kim &
    # Rush's Seq-KD); closest_to_reference: the one with the highest sentence BLEU against the
    # human reference (their Seq-Inter: still a translation the teacher finds likely, so as easy
    # to learn, but nearer what the test set rewards).
    selection: Literal["top", "closest_to_reference"] = "top"
    # Also keep the teacher's k most likely words (and their probabilities, renormalised over the
    # k) at every position of its translations, for word-level distillation without the teacher in
    # the training loop (distill.student.word_level.from_kd_corpus). Collected while decoding
    # greedily: the same distributions a teacher-forced pass would give, at no extra cost.
    top_k: PositiveInt | None = None

    @model_validator(mode="after")
    def _selection_needs_a_beam(self) -> "KDCorpusConfig":
        if self.selection == "closest_to_reference" and self.beam < 2:
            raise ValueError("selection: closest_to_reference chooses among the beam's hypotheses; it needs beam >= 2")
        if self.top_k is not None and self.beam != 1:
            raise ValueError("top_k is collected while the teacher decodes greedily; it needs beam: 1")
        return self


class WordLevelKD(Strict):
    enabled: bool = False
    alpha: Fraction = 0.5  # weight of the teacher's distribution; (1 - alpha) on the hard labels
    temperature: PositiveFloat = 1.0
    # False: the teacher runs on every training batch (its whole distribution, at `temperature`).
    # True: its k most likely words per position, kept by the KD corpus as the teacher translated
    # (distill.corpus.top_k), on the corpus's pairs; mixed-in references keep their hard labels.
    # Training then costs what it costs without distillation.
    from_kd_corpus: bool = False

    @model_validator(mode="after")
    def _stored_probabilities_are_at_temperature_one(self) -> "WordLevelKD":
        if self.from_kd_corpus and self.temperature != 1.0:
            raise ValueError(
                "from_kd_corpus: the corpus keeps the teacher's probabilities at temperature 1; set temperature: 1"
            )
        return self


class StudentConfig(Strict):
    model: ModelSpec = ModelSpec(d_model=128, encoder_layers=4, decoder_layers=2, heads=4, head_dim=32, ffn_dim=512)
    train: TrainConfig = TrainConfig()
    # Fraction of original reference pairs mixed into the distilled corpus (0 = KD only).
    reference_mix: Fraction = 0.0
    word_level: WordLevelKD = WordLevelKD()
    # Start the student's (tied) embedding from the teacher's, projected onto its top d_model
    # principal directions and scaled to the student's initial spread: the word geometry the
    # teacher learnt, instead of noise, in the half of a small student's parameters that the
    # embedding is. Needs the teacher's vocabulary.
    embeddings_from_teacher: bool = False


class DistillConfig(Strict):
    corpus: KDCorpusConfig = KDCorpusConfig()
    student: StudentConfig = StudentConfig()
    # Also train the same student shape on the references only, to show what KD bought.
    ablation: bool = True
    # The reference-only student's dropout (None: the student's). A fair ablation regularizes each
    # corpus as it needs: human references overfit a small student sooner than a teacher's
    # translations do, so the best dropout of one is not the best of the other.
    ablation_dropout: OpenFraction | None = None
    # The ablation's budget. student_steps: as many steps as the student took, at the student's
    # batch size (the same compute, whatever the machine's speed while each trained: on a shared
    # VM equal minutes gave the two 6359 and 5654 tokens/s in one run). own: the student's train
    # budgets, minutes included. side_by_side: the student's budgets, with the two trained at the
    # same time, each in its own process on half the cores: equal minutes on an equally loaded
    # machine. Where one training cannot use two cores well (a small model on a small CPU) the pair
    # gets through more work than one after the other: on 2 cores, two one-thread trainings each
    # took 0.63x the steps a minute of one two-thread training (the pair: 1.27x the work).
    ablation_budget: Literal["student_steps", "own", "side_by_side"] = "student_steps"
    # Start the ablation from the teacher's projected embedding too (see the student's
    # embeddings_from_teacher), so that it measures what the KD corpus alone buys.
    ablation_embeddings_from_teacher: bool = False

    @model_validator(mode="after")
    def _stored_distributions_are_asked_of_the_corpus(self) -> "DistillConfig":
        if self.student.word_level.enabled and self.student.word_level.from_kd_corpus and self.corpus.top_k is None:
            raise ValueError(
                "student.word_level.from_kd_corpus needs the corpus to keep the teacher's "
                "distributions: set distill.corpus.top_k (8 is plenty)"
            )
        return self


# What a training's budget was and whether a time cap cut it short, in words: in its result (the
# manifest), which `status` (the train and prune stages declare it as their `cut`) and the report
# (pipeline/report/table.py) read back.
def budget_text(max_steps: int | None, max_epochs: int | None, max_minutes: float | None) -> str:
    parts = [f"{max_steps} steps"] if max_steps is not None else []
    if max_epochs is not None:
        parts.append(f"{max_epochs} epochs")
    return " or ".join(parts) + (f", capped at {max_minutes:g} min" if max_minutes is not None else "")


def cut_text(step: int, max_steps: int | None, max_epochs: int | None) -> str:
    of = f" of {max_steps}" if max_steps is not None else f" (budget {max_epochs} epochs)"
    return f"cut by time at step {step}{of}"
