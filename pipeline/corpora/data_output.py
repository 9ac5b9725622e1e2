"""What the data stage returns (its manifest's metrics), read by the stages after it: the
languages, the test sets it wrote and how many pairs each split holds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from ..engine.stage import Output


@dataclass(frozen=True)
class DataOutput(Output):
    src_lang: str
    tgt_lang: str
    source: str  # multi30k, files
    test_sets: list[str]  # each written as test.<name>.src/.tgt, its pair count under <name>_pairs
    dropped: dict[str, int]  # training pairs dropped by cleaning, by reason
    train_raw_pairs: int
    train_pairs: int  # lines of train.src/.tgt (weighted corpora: copies included)
    valid_pairs: int
    train_corpora: list[dict] | None = None  # several weighted corpora: each one's counts
    extra: dict[str, int] = field(default_factory=dict)  # <test set>_pairs

    EXTRA: ClassVar[re.Pattern] = re.compile(r".+_pairs")
