"""The data stage: find (or download) the parallel corpus, verify it, clean it, write plain text
(build.py). Its section is the recipe's `data`; where the corpus is the user's own files, their
digests enter the fingerprint, so the artifact follows the files' content and not their place."""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from mt_runtime.files import UnsafeFile, open_regular
from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from ...corpora.data_output import DataOutput
from ...engine.errors import UserInputError
from ...engine.recipe import PositiveInt, Strict
from ...engine.stage import Inputs, Planner, Section, Stage


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
                raise ValueError(
                    f"unknown key '{key}' "
                    f"({f'did you mean {close[0]!r}?' if close else 'known keys: ' + ', '.join(known)})"
                )
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
    Discriminator(lambda v: "[corpora]" if isinstance(v, (list, tuple)) else "[split]"),
]


class FilesSource(Strict):
    train: TrainFiles
    valid: FileSplit
    test: dict[str, FileSplit] = {}

    @field_validator("train", mode="before")
    @classmethod
    def _train_form(cls, value):
        if isinstance(value, dict) and ("weight" in value or "name" in value):
            raise ValueError(
                "'name' and 'weight' are keys of a list of corpora "
                "(train: [{tsv: a.tsv, weight: 2}, {tsv: b.tsv}]), not of one split"
            )
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
                raise ValueError(
                    f"corpus names must be unique ({', '.join(repr(n) for n in twice)} more than once; "
                    "a name defaults to the file's stem: give each corpus a 'name')"
                )
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


@dataclass(frozen=True)
class DataInputs(Inputs):
    """None: the data stage starts the chain."""


def plan(p: Planner) -> None:
    p.add("data", p.recipe.data, extra=_data_content(p.recipe.data))


def _data_content(cfg: DataConfig) -> dict:
    """What identifies the data's content, so the fingerprint follows it and not its location."""
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


STAGE = Stage(
    "data",
    1,
    "fetch, verify and clean the parallel corpus",
    settings=DataConfig,
    inputs=DataInputs,
    plan=plan,
    build="pipeline.stages.data.build",
    output=DataOutput,  # pipeline/corpora/data_output.py: the stages after it read it
    sections=(Section("data", DataConfig, DataConfig()),),
    headline=("train_pairs",),
)
