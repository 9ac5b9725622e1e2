"""The corpus format the data stage writes and every later stage reads: one folder of plain
UTF-8 text, `<split>.src` and `<split>.tgt` (train, valid, test.<name>), one normalized sentence
a line, the two files of a split line-aligned."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

# The longest input line `pipeline translate` reads by default (bytes); a longer one is cut.
DEFAULT_MAX_LINE_BYTES = 16384
_SPACES = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def normalize(line: str, nfc: bool = True) -> str:
    if nfc:
        line = unicodedata.normalize("NFC", line)
    # Control characters carry no meaning in text and confuse tokenizers; tabs become spaces.
    line = _CONTROL.sub(" ", line)
    return _SPACES.sub(" ", line).strip()


def write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def read_split(folder: Path, name: str) -> tuple[list[str], list[str]]:
    """Read a split of a data artifact (e.g. 'train', 'valid', 'test.test_2016_flickr')."""
    src = (folder / f"{name}.src").read_text(encoding="utf-8").split("\n")[:-1]
    tgt = (folder / f"{name}.tgt").read_text(encoding="utf-8").split("\n")[:-1]
    return src, tgt
