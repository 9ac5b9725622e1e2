"""Recipe files: YAML validated by a strict, typed schema.

A recipe names the stages to run and configures each one. Unknown keys, wrong types and
impossible values are rejected with one line per problem, naming the file and the dotted key.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      field_validator, model_serializer, model_validator)

from model.files import UnsafeFile, read_bounded
from model.sizes import MAX_DIM, MAX_LAYERS, MAX_VOCAB, size_problem

from .errors import RecipeError

# Every number a recipe gives is bounded, here, once: floats are finite (Strict: no inf, no nan),
# counts are at most MAX_COUNT, model sizes within model/sizes.py's bounds (Dim, Layers), and the
# YAML itself holds no integer beyond 64 bits (_check_numbers). So `lr: .inf`, `seed: 1e23` or
# `d_model: 1e9` fail validation with one line instead of a stage later.
MAX_COUNT = 2**31 - 1
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
OpenFraction = Annotated[float, Field(ge=0, lt=1)]
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]
Layers = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
# bf16 autocast. auto: where the GPU supports it, and on a CPU where a probe at the model's shapes
# measures it faster than float32 (pipeline/training/speed_probe.py); on: always (a warning gives the
# measured slowdown where it is slower); off: float32. YAML 1.1 reads a bare on/off as a
# boolean; the user meant the word.
Bf16 = Annotated[Literal["auto", "on", "off"],
                 BeforeValidator(lambda v: {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v)]
# The models a recipe can build (each a node of that name, exported as export.<name>), in report order.
MODEL_NODES = ("teacher", "student", "student_ref", "pruned")
MAX_RECIPE_BYTES = 1 << 20  # a recipe file (and each file it extends) is read up to this size
MAX_ALIAS_VALUES = 10_000  # values YAML aliases may repeat in one recipe file, all together
_MAX_YAML_INT = 2**63


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------- data
class FileSplit(Strict):
    """One split of a user's own corpus: two aligned plain-text files, or one TSV file."""

    src: str | None = None
    tgt: str | None = None
    tsv: str | None = None

    @model_validator(mode="after")
    def _one_form(self):
        if self.tsv is None and (self.src is None or self.tgt is None):
            raise ValueError("give either 'tsv' or both 'src' and 'tgt'")
        if self.tsv is not None and (self.src is not None or self.tgt is not None):
            raise ValueError("give either 'tsv' or 'src'/'tgt', not both")
        return self


# Suffixes a default corpus name leaves out: compression (pipeline/corpora/user_files.py reads these).
_COMPRESSED_SUFFIXES = (".gz", ".xz", ".bz2", ".zst")
MAX_CORPUS_WEIGHT = 1000.0


class TrainCorpus(FileSplit):
    """One of several training corpora: a split, a name (default: the file's stem, without a
    compression suffix: `europarl.tsv.gz` -> `europarl`, `news.en` -> `news`) and a weight. The data
    stage writes each kept pair of a corpus floor(weight) times, and once more for a hashed
    fraction (weight - floor) of its pairs: 0.5 keeps about half, 2.5 writes 2 or 3 copies."""

    name: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    weight: Annotated[float, Field(gt=0, le=MAX_CORPUS_WEIGHT)] = 1.0

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value):
        # Strict would refuse an unknown key too, but its hint would name FileSplit's keys (_model_at
        # finds FileSplit at `train`): this one names a corpus's.
        known = list(cls.model_fields)
        for key in value if isinstance(value, dict) else ():
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                raise ValueError(f"unknown key '{key}' "
                                 f"({f'did you mean {close[0]!r}?' if close else 'known keys: ' + ', '.join(known)})")
        return value

    @property
    def label(self) -> str:
        """The corpus's name in metrics and messages."""
        if self.name is not None:
            return self.name
        path = Path(self.tsv if self.tsv is not None else self.src)
        if path.suffix in _COMPRESSED_SUFFIXES:
            path = path.with_suffix("")
        return path.stem or path.name


# `train` is one split, as before, or a list of weighted corpora. The discriminator picks the form
# from the value, so an error names that form's problem only (pydantic would report both); the
# tags hold '[', so that error lines leave them out of the key path (_explain).
TrainFiles = Annotated[
    Annotated[list[TrainCorpus], Tag("[corpora]")] | Annotated[FileSplit, Tag("[split]")],
    Discriminator(lambda v: "[corpora]" if isinstance(v, (list, tuple)) else "[split]")]


class FilesSource(Strict):
    train: TrainFiles
    valid: FileSplit
    test: dict[str, FileSplit] = {}

    @field_validator("train", mode="before")
    @classmethod
    def _train_form(cls, value):
        if isinstance(value, dict) and ("weight" in value or "name" in value):
            raise ValueError("'name' and 'weight' are keys of a list of corpora "
                             "(train: [{tsv: a.tsv, weight: 2}, {tsv: b.tsv}]), not of one split")
        if isinstance(value, (list, tuple)) and not value:
            raise ValueError("must be one split or a list of at least one corpus (this list is empty)")
        return value

    @field_validator("train")
    @classmethod
    def _unique_names(cls, value):
        if isinstance(value, list):
            names = [corpus.label for corpus in value]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"corpus names must be unique ({', '.join(repr(n) for n in twice)} more than once; "
                                 "a name defaults to the file's stem: give each corpus a 'name')")
        return value

    @property
    def train_corpora(self) -> list[TrainCorpus]:
        """The training corpora in order: one split is one corpus of weight 1."""
        train = self.train
        return list(train) if isinstance(train, list) else [TrainCorpus(**train.model_dump())]


class CleanConfig(Strict):
    normalize_nfc: bool = True
    max_words: PositiveInt = 100
    max_ratio: Annotated[float, Field(ge=1)] = 3.0
    dedup: bool = True


class DataConfig(Strict):
    source: Literal["multi30k", "files"] = "multi30k"
    src_lang: str = "en"
    tgt_lang: str = "fr"
    # Where the multi30k files are looked up; else $PIPELINE_DATA, else downloaded (checksummed).
    data_dir: str | None = None
    url: str = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
    test_sets: list[str] = ["test_2016_flickr", "test_2017_flickr"]
    files: FilesSource | None = None
    # Keep only the first N training / validation pairs (small recipes and tests).
    max_train: PositiveInt | None = None
    max_valid: PositiveInt | None = None
    max_test: PositiveInt | None = None
    clean: CleanConfig = CleanConfig()

    @model_validator(mode="after")
    def _files_given(self):
        if self.source == "files" and self.files is None:
            raise ValueError("source 'files' needs a 'files' section (train, valid, test)")
        return self


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
            raise ValueError("kind: teacher takes the imported teacher's vocabulary as it is: drop vocab_size "
                             "and max_sentences")
        return self


# -------------------------------------------------------------------------------- model
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
        problem = size_problem(self.d_model, self.head_dim, [self.heads] * enc, [self.heads] * dec,
                               [self.heads] * dec, [self.ffn_dim] * enc, [self.ffn_dim] * dec,
                               embed_dim=self.embed_dim, max_positions=self.max_positions)
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
            cap = " (max_minutes is a cap, not a budget: the same recipe would train a different model " \
                  "on each machine)" if self.max_minutes is not None else ""
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
            raise ValueError("an imported teacher (pretrained) is not trained here: drop teacher.model and "
                             "teacher.train")
        return self


# ---------------------------------------------------------------------------- distill
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
            raise ValueError("selection: closest_to_reference chooses among the beam's hypotheses; "
                             "it needs beam >= 2")
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
            raise ValueError("from_kd_corpus: the corpus keeps the teacher's probabilities at temperature 1; "
                             "set temperature: 1")
        return self


class StudentConfig(Strict):
    model: ModelSpec = ModelSpec(d_model=128, encoder_layers=4, decoder_layers=2, heads=4,
                                 head_dim=32, ffn_dim=512)
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
            raise ValueError("student.word_level.from_kd_corpus needs the corpus to keep the teacher's "
                             "distributions: set distill.corpus.top_k (8 is plenty)")
        return self


class TrainNode(Strict):
    """What one train node runs: the teacher, the distilled student or its reference-only ablation."""

    role: Literal["teacher", "student", "student_ref"]
    model: ModelSpec
    train: TrainConfig
    reference_mix: Fraction = 0.0
    word_level: WordLevelKD | None = None
    embeddings_from_teacher: bool = False
    budget: Literal["student_steps", "own", "side_by_side"] | None = None  # the ablation's
    # The nodes built at the same time, each on its share of the cores (a model trained on a
    # share is not taken for one trained on all of them).
    side_by_side: list[str] = []


# ------------------------------------------------------------------------------- prune
class PruneFinetune(Strict):
    """The short fine-tune after each pruning step (on the KD corpus if there is one)."""

    steps: PositiveInt = 300
    lr: PositiveFloat = 3e-4
    # Fresh Adam moments after pruning: ramp up briefly, then decay as 1/sqrt(step).
    warmup_steps: NonNegInt = 50
    batch_tokens: PositiveInt = 4000
    max_minutes: PositiveFloat | None = None
    # Batch order (and dropout) of step i's fine-tune: seed + i - 1. Another seed is another draw
    # of the same recipe: how much of a pruned model's score is chance.
    seed: Seed = 1
    bf16: Bf16 = "auto"


class PruneConfig(Strict):
    # global: one ranking over all layers (scores normalised per layer); uniform: every attention
    # layer keeps the same number of heads (for runtimes that need one head count per model).
    ranking: Literal["global", "uniform"] = "global"
    # Scores a global ranking compares: raw E|dL/dgate| (none), or L2-normalised per layer as in
    # Michel et al. (layer). On a 3+2-layer, 4-head model trained on Multi30k, removing 50% of the
    # heads by layer-normalised scores left 7.2 greedy valid BLEU, by raw scores 18.4 (unpruned
    # 19.3; before fine-tuning): normalising 4 scores per layer erases the differences between layers.
    normalize: Literal["none", "layer"] = "none"
    # Prune to this fraction of all attention heads removed, in `steps` steps, each followed by a
    # fine-tune ...
    target_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.5
    steps: PositiveInt = 2
    # ... but stop early: a step whose fine-tuned valid BLEU is more than this below the unpruned
    # model's is rolled back and pruning ends there (null: no limit).
    max_bleu_drop: Annotated[float, Field(ge=0)] | None = None
    min_heads_per_layer: PositiveInt = 1
    # Head importance: expected |gradient| over this many validation batches (all of valid if fewer).
    importance_batches: PositiveInt = 20
    # Small batches: the score averages |gradient| per batch, and one big batch's mean gradient
    # would let sentences that disagree about a head cancel out.
    importance_batch_tokens: PositiveInt = 1000
    finetune: PruneFinetune = PruneFinetune()
    # FFN neuron pruning with the same importance machinery (0 = off): this fraction of all FFN
    # hidden units is removed, spread over the same steps and ranked like the heads.
    ffn_fraction: OpenFraction = 0.0
    # Greedy valid BLEU (the before/after figures and the max_bleu_drop test) on the first N
    # validation sentences; null: all of them. A 0.5 tolerance needs the whole set (~1000).
    valid_bleu_sentences: PositiveInt | None = None
    # Latency of unpruned vs pruned (batch 1, greedy, one thread), interleaved sentence by sentence.
    latency_sentences: PositiveInt = 50
    latency_repeats: PositiveInt = 3


# ------------------------------------------------------------------------------ export
class ParityConfig(Strict):
    max_abs_diff: PositiveFloat = 1e-4
    batch_sizes: list[PositiveInt] = [1, 3, 8]
    decode_sentences: PositiveInt = 200
    beam: PositiveInt = 4  # beam size of the beam-search half of the decode check (greedy is the other)
    # Intra-op threads of both runtimes during the checks; 1 keeps the batch-1 timing they
    # record (ONNX Runtime vs PyTorch) free of thread-pool noise on a shared machine.
    threads: PositiveInt = 1


class ShortlistConfig(Strict):
    # Every batch may produce the `frequent` most frequent target words, and for each of its
    # source words the `per_word` target words most above their base rate beside it (model/shortlist.py).
    frequent: Annotated[int, Field(ge=1, le=1_000_000)] = 300
    per_word: Annotated[int, Field(ge=1, le=10_000)] = 50
    max_pairs: Annotated[int, Field(ge=1, le=100_000_000)] = 2_000_000  # the first training pairs counted


class ExportConfig(Strict):
    # Model artifacts to export besides the final one (the last of teacher, student, pruned),
    # which is always exported because quantization and shipping start from it.
    also: list[Literal["teacher", "student", "student_ref"]] = []
    opset: Annotated[int, Field(ge=17, le=21)] = 17
    # Attention as onnxruntime's fused MultiHeadAttention contrib op (one node instead of ~15;
    # measured faster decoding); false: standard ONNX ops only, for runtimes other than ORT.
    fused_attention: bool = True
    optimize: bool = True
    fp16: bool = True
    parity: ParityConfig = ParityConfig()
    # A lexical shortlist for batches (the output projection over a batch's likely words); null: none.
    shortlist: ShortlistConfig | None = None


class QuantizeConfig(Strict):
    # int8_dynamic: int8 weights per output column, activations per row (model/onnx_quantize.py).
    dynamic: bool = True
    per_channel: bool = True  # int8_static's weights: a scale per output column (else one per matrix)
    static: bool = True
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"
    calibration_sentences: PositiveInt = 200
    max_bleu_drop: Annotated[float, Field(ge=0)] = 0.5
    guard_sentences: PositiveInt | None = None  # validation sentences scored by the guard (all if null)
    # Batch-1 greedy CPU latency of each variant against fp32, timed on this many validation
    # sentences, one thread, interleaved (0 = skip; the benchmark stage measures it properly).
    latency_sentences: NonNegInt = 50


class EvaluateConfig(Strict):
    test_sets: list[str] | None = None  # null: every test set the data stage produced
    beam: PositiveInt = 4
    length_penalty: Annotated[float, Field(ge=0)] = 1.0
    batch_tokens: PositiveInt = 4000
    greedy_too: bool = True  # also score greedy decoding (what batch-1 serving uses)
    alone_too: bool = True  # ONNX packages: translate each sentence alone too, and count outputs that differ


class EvaluateNode(EvaluateConfig):
    """What one evaluate node runs: the recipe's evaluate section and the variant it scores."""

    variant: str  # the model (teacher, pruned, ...) or package variant (int8_dynamic, ...)
    package: str | None = None  # the package folder inside the model's artifact (None: the PyTorch model)
    runtime: Literal["torch", "onnxruntime"]
    device: Literal["cpu", "cuda"] = "cpu"
    machine: dict | None = None  # the GPU, for a CUDA node: another GPU gives another artifact


class VersusConfig(Strict):
    """Ours against CTranslate2 on the same weights (the final model's int8 and float32 packages),
    both in one process at the same thread count, taking turns batch by batch, and each alone in
    a process of its own: sentences/s at each point, and each side at its own best thread count."""

    sentences: PositiveInt = 256  # the test set's first N: enough for several batches of 64
    batches: list[PositiveInt] = [1, 32, 64]
    beams: list[PositiveInt] = [1, 4]
    rounds: NonNegInt = 5  # passes over the sample each; the ratio is the rounds' median; 0: not measured
    # Passes of each side alone, in a process of its own per thread count (0: not measured);
    # fewer than `rounds` to keep the stage's time: about 4 minutes at 3 on the default recipe.
    separate_rounds: NonNegInt = 3


class BenchmarkConfig(Strict):
    test_set: str | None = None  # null: the first test set
    sentences: PositiveInt = 100
    batch_size: PositiveInt = 32
    throughput_beam: PositiveInt = 4  # beam of the throughput runs (bulk translation); latency: greedy and 4
    threads: list[Literal["one", "all"] | PositiveInt] = ["one", "all"]
    runtimes: list[Literal["torch", "onnxruntime", "ctranslate2"]] = [
        "torch", "onnxruntime", "ctranslate2"]
    devices: list[Literal["cpu", "cuda"]] = ["cpu", "cuda"]
    min_repeats: PositiveInt = 2
    max_repeats: PositiveInt = 6
    stable_within: PositiveFloat = 0.05  # stop repeating once the p50 moves less than this
    # Rounds of ours-then-CTranslate2 (alternating order) latency passes, process after process,
    # for the final model's rows: a ratio that machine-speed drift between rows does not move.
    paired_rounds: NonNegInt = 3
    versus: VersusConfig = VersusConfig()


class BenchmarkNode(BenchmarkConfig):
    """What the benchmark node runs: the recipe's section, the variants to measure (the graph's
    rows: name, runtime, device, compute type, the node and package that hold each), the final
    model (the peer runtimes' source) and, on a GPU machine, which GPU."""

    variants: list[dict] = []
    final_model: str | None = None
    machine: dict | None = None


class ReportTargets(Strict):
    """What the report holds each int8 student in onnxruntime to, against the teacher in PyTorch."""

    speedup: PositiveFloat = 8.0  # batch-1 greedy sentences/s over the teacher's, at least
    bleu_delta: float = -1.0  # BLEU minus the teacher's, at least
    bytes_ratio: PositiveFloat = 0.1  # bytes over the teacher's, at most


class ReportConfig(Strict):
    max_bleu_loss: PositiveFloat = 1.0  # for the recommendation line
    targets: ReportTargets = ReportTargets()


class ReportNode(ReportConfig):
    recipe: str | None = None  # the recipe's name, for the report's title


class Recipe(Strict):
    # Names the run logs and the `latest` pointer; defaults to the file's stem.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] | None = None
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig | None = None
    teacher: TeacherConfig | None = None
    distill: DistillConfig | None = None
    prune: PruneConfig | None = None
    export: ExportConfig | None = None
    quantize: QuantizeConfig | None = None
    evaluate: EvaluateConfig | None = None
    benchmark: BenchmarkConfig | None = None
    report: ReportConfig | None = None


# ----------------------------------------------------------------------------- loading
def load_recipe(path: str | Path, overrides: list[str] = ()) -> tuple[Recipe, dict]:
    """Read, merge (`extends:`), override (`a.b=c`) and validate a recipe.

    Returns the validated recipe and the raw merged mapping (what the run log records).
    Raises RecipeError with one line per problem.
    """
    path = Path(path)
    raw = _load_with_extends(path, seen=())
    for item in overrides:
        _apply_override(raw, item, path)
    raw.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip("._-")[:100] or "recipe")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError([f"{path}: {line}" for line in _explain(exc, raw)]) from None
    return recipe, raw


def _read_yaml(path: Path, referrer: Path | None) -> dict:
    where = f"{referrer}: extends" if referrer else str(path)
    if not path.exists():
        raise RecipeError([f"{where}: file not found: {path}"])
    if path.is_dir():
        raise RecipeError([f"{where}: is a directory, not a recipe file: {path}"])
    try:
        text = read_bounded(path, MAX_RECIPE_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError([f"{path}: not UTF-8 text (byte {exc.start})"]) from None
    except UnsafeFile as exc:
        prefix = f"{referrer}: extends: " if referrer else ""
        raise RecipeError([f"{prefix}{exc} (a recipe is a regular file of at most {MAX_RECIPE_BYTES} bytes)"]) from None
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        data = _safe_load(text, str(path))
    except ValueError as exc:  # int(): an integer of more digits than Python converts (4300)
        raise RecipeError([f"{path}: {_digits_message(exc)}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError([f"{path}: {at}YAML syntax error: {problem}"]) from None
    except RecursionError:
        raise RecipeError([f"{path}: YAML nested too deeply"]) from None
    if data is None:
        raise RecipeError([f"{path}: empty recipe (expected a mapping of stage sections)"])
    if not isinstance(data, dict):
        raise RecipeError([f"{path}: top level must be a mapping, got {_kind(data)}"])
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeError([f"{path}: keys must be strings, got {_short_repr(bad[0])}"])
    _check_numbers(data, str(path))
    return data


def _safe_load(text: str, where: str) -> Any:
    """yaml.safe_load, refusing a document whose aliases would repeat more than MAX_ALIAS_VALUES
    values (or one that holds itself) before anything is built from it: PyYAML shares an aliased
    value instead of copying it, but whatever walks the result (the checks here, deepcopy, the
    schema) visits it once per alias, so nested aliases (a "billion laughs") took minutes."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_aliases(root: yaml.Node, where: str) -> None:
    """RecipeError where the values under `root`, counted once per alias that reaches them, exceed
    the distinct values by more than MAX_ALIAS_VALUES, or where a value contains itself. One pass
    over the distinct nodes (each one's expanded size kept), without recursion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if finished:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            open_nodes.discard(id(node))
            if sizes[id(node)] - len(sizes) > MAX_ALIAS_VALUES:
                raise RecipeError([f"{where}: YAML aliases repeat more than {MAX_ALIAS_VALUES} values; "
                                   "a recipe may reuse a section by alias, not build a tree of them"])
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise RecipeError([f"{where}: a YAML alias inside the value it names (a recursive value)"])
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _digits_message(exc: ValueError) -> str:
    if "digits" in str(exc):
        return "a number has more digits than a recipe takes (integers up to 2**63)"
    return f"unreadable value ({str(exc).splitlines()[0][:100]})"


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= _MAX_YAML_INT:
        return "an integer beyond 64 bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_numbers(value: Any, where: str, key: str = "") -> None:
    """No integer beyond 64 bits anywhere in a recipe (YAML reads 0x... of any length, and a
    pydantic error would print it)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and abs(value) >= _MAX_YAML_INT:
        raise RecipeError([f"{where}: {key or '(top level)'}: integer too large (recipes take integers up to 2**63)"])
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(k, where, key)
            _check_numbers(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, where, f"{key}.{i}" if key else str(i))


def _load_with_extends(path: Path, seen: tuple[Path, ...], referrer: Path | None = None) -> dict:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in (*seen, resolved))
        raise RecipeError([f"{path}: extends: cycle: {chain}"])
    data = _read_yaml(path, referrer)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise RecipeError([f"{path}: extends: must be a file path, got {_kind(parent)}"])
    base = _load_with_extends(path.parent / parent, (*seen, resolved), referrer=path)
    return _deep_merge(base, data)


def _deep_merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _apply_override(raw: dict, item: str, path: Path) -> None:
    if "=" not in item:
        raise RecipeError([f"{path}: --set {item!r}: expected KEY=VALUE, e.g. teacher.train.lr=0.001"])
    dotted, _, text = item.partition("=")
    keys = dotted.strip().split(".")
    if not all(keys):
        raise RecipeError([f"{path}: --set {item!r}: empty key"])
    try:
        value = _safe_load(text, f"{path}: --set {dotted}") if text.strip() else None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise RecipeError([f"{path}: --set {dotted}: {_digits_message(exc)}"]) from None
    except yaml.YAMLError:
        value = text
    _check_numbers(value, f"{path}: --set", dotted.strip())
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            raise RecipeError([f"{path}: --set {dotted}: {where} is not a mapping"])
        node = child
    node[keys[-1]] = value


# ------------------------------------------------------------------------ error messages
def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for key in loc:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema class that the mapping at `loc` is validated against (for "did you mean")."""
    model: Any = Recipe
    for key in loc:
        if isinstance(key, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(key)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Optional[X], list[X], dict[str, X] -> X, so nested schemas can be found."""
    for _ in range(4):
        origin = get_origin(annotation)
        if origin is None:
            return annotation
        args = [a for a in get_args(annotation) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if models:
            return models[0]
        if not args:
            return annotation
        annotation = args[-1]
    return annotation


def _num(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


_MESSAGES = {
    "greater_than": lambda c: f"must be > {_num(c.get('gt'))}",
    "greater_than_equal": lambda c: f"must be >= {_num(c.get('ge'))}",
    "less_than": lambda c: f"must be < {_num(c.get('lt'))}",
    "less_than_equal": lambda c: f"must be <= {_num(c.get('le'))}",
    "int_type": lambda c: "must be an integer",
    "int_parsing": lambda c: "must be an integer",
    "int_from_float": lambda c: "must be a whole number",
    "int_parsing_size": lambda c: "must be an integer of a sane size",
    "float_type": lambda c: "must be a number",
    "float_parsing": lambda c: "must be a number",
    "finite_number": lambda c: "must be a finite number",
    "bool_type": lambda c: "must be true or false",
    "bool_parsing": lambda c: "must be true or false",
    "string_type": lambda c: "must be a string",
    "list_type": lambda c: "must be a list",
    "dict_type": lambda c: "must be a mapping",
    "model_type": lambda c: "must be a mapping",
    "model_attributes_type": lambda c: "must be a mapping",
    "literal_error": lambda c: f"must be one of {c.get('expected')}",
    "missing": lambda c: "required key is missing",
    "string_pattern_mismatch": lambda c: "must be letters, digits, '_', '.' or '-' (at most 100)",
}


def _explain(exc: ValidationError, raw: dict) -> list[str]:
    lines: list[str] = []
    seen_locs: set[tuple] = set()
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        # pydantic reports a value once per union member; keep the most specific (first) one.
        loc = tuple(k for k in loc if not (isinstance(k, str) and ("[" in k or k.startswith("function-"))))
        if loc in seen_locs:
            continue
        seen_locs.add(loc)
        dotted = ".".join(str(k) for k in loc) or "(top level)"
        etype = err["type"]
        if etype == "extra_forbidden":
            parent = _model_at(loc[:-1])
            hint = ""
            if parent is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f" (did you mean '{close[0]}'?)"
                else:
                    hint = f" (known keys: {', '.join(parent.model_fields)})"
            lines.append(f"{dotted}: unknown key{hint}")
            continue
        if etype in _MESSAGES:
            message = _MESSAGES[etype](err.get("ctx") or {})
        else:
            message = err["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, "):]
        got = _lookup(raw, loc)
        # A model-level check (e.g. "set at least one budget") concerns the whole mapping.
        if etype != "missing" and not (etype == "value_error" and isinstance(got, dict)):
            shown = _kind(got) if isinstance(got, (dict, list)) or got is None else repr(got)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            message = f"{message}, got {shown}"
        lines.append(f"{dotted}: {message}")
    return lines or [str(exc).splitlines()[0]]


def dump_config(section: BaseModel | None) -> Any:
    """Canonical plain-data form of a config section (what fingerprints hash)."""
    return None if section is None else section.model_dump(mode="json")
