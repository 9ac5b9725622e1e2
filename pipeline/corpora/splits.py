"""The corpus format the data stage writes and every later stage reads: one folder of plain
UTF-8 text, `<split>.src` and `<split>.tgt` (train, valid, test.<name>), one normalized sentence
a line (normalized by mt_runtime.lines.normalize, as `translate` cleans its input), the two files
of a split line-aligned."""

from __future__ import annotations

import array
import os
import random
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from ..engine.errors import StageFailed


def write_pairs(
    src_path: Path,
    tgt_path: Path,
    pairs: Iterable[tuple[str, str]],
    on_pair: Callable[[int], None] | None = None,
    every: int = 10_000,
) -> int:
    """Write a split's two files as the pairs come; returns how many. `on_pair(n)` reports
    progress every `every` pairs and at the end."""
    written = 0
    with (
        open(src_path, "w", encoding="utf-8", newline="\n") as src,
        open(tgt_path, "w", encoding="utf-8", newline="\n") as tgt,
    ):
        for s, t in pairs:
            src.write(s + "\n")
            tgt.write(t + "\n")
            written += 1
            if on_pair and written % every == 0:
                on_pair(every)
    if on_pair and written % every:
        on_pair(written % every)
    return written


def split_lines(folder: Path, name: str, side: str) -> Iterator[str]:
    """One side ('src' or 'tgt') of a split, line by line, without holding the file."""
    with open(folder / f"{name}.{side}", encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


class LineIndex:
    """Random access to the lines of a text file, holding only where each starts (8 bytes a
    line): the KD corpus reads its sources in length order, and a reference mix its picks."""

    def __init__(self, path: Path, limit: int | None = None):
        starts = array.array("q", [0])
        with open(path, "rb") as f:
            for n, line in enumerate(f):
                if limit is not None and n >= limit:
                    break
                starts.append(starts[-1] + len(line))
        self.starts = np.frombuffer(starts, dtype=np.int64)
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(i)
        start, end = int(self.starts[i]), int(self.starts[i + 1])
        line = os.pread(self._fd, end - start, start).decode("utf-8")
        return line[:-1] if line.endswith("\n") else line

    def close(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "LineIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()


def reservoir_sample(items: Iterable[str], size: int, rng: random.Random) -> list[str]:
    """A uniform sample of `size` items from a stream of unknown length, holding only the
    sample (Vitter's algorithm R), in stream order of arrival into the reservoir."""
    sample: list[str] = []
    for seen, item in enumerate(items):
        if seen < size:
            sample.append(item)
        else:
            slot = rng.randint(0, seen)
            if slot < size:
                sample[slot] = item
    return sample


def read_split(folder: Path, name: str) -> tuple[list[str], list[str]]:
    """Read a split of a data artifact (e.g. 'train', 'valid', 'test.test_2016_flickr')."""
    src, tgt = list(split_lines(folder, name, "src")), list(split_lines(folder, name, "tgt"))
    if len(src) != len(tgt):
        raise misaligned(folder / f"{name}.src", len(src), folder / f"{name}.tgt", len(tgt))
    return src, tgt


def check_aligned(first: Path, second: Path) -> int:
    """The number of lines of two line-aligned files a stage reads side by side (src/tgt,
    kd.src/kd.tgt, hypotheses/references); StageFailed naming both where they differ."""
    counts = count_lines(first), count_lines(second)
    if counts[0] != counts[1]:
        raise misaligned(first, counts[0], second, counts[1])
    return counts[0]


def misaligned(first: Path, first_lines: int, second: Path, second_lines: int) -> StageFailed:
    """The one-line failure of two files that should be line-aligned and are not (exit 1: files a
    stage wrote; a user's data files are DataError, exit 2, in pipeline/corpora/user_files.py)."""
    return StageFailed(
        f"{first} has {first_lines} lines but {second} has {second_lines}: the two files must be line-aligned"
    )
