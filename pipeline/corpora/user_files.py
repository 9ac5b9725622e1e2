"""Reading a parallel corpus as its owner has it: plain, .gz, .xz, .bz2 or .zst text, one sentence a
line, as two line-aligned files or one TSV; streamed line by line, so memory does not grow with
the corpus. Every error names the file and, where there is one, the line.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from pathlib import Path
from typing import BinaryIO, Iterator

from mt_runtime.files import UnsafeFile, open_regular

from ..engine.errors import DataError
from .cleaning import TrainingCorpus

# The longest line a corpus file may hold (bytes): far above any sentence, far below a file that
# lost its line breaks (which would otherwise be read whole into memory).
MAX_LINE_BYTES = 1 << 20
COMPRESSED = {".gz": "gzip", ".xz": "xz", ".bz2": "bzip2", ".zst": "zstandard"}
ZSTD_STEP = 256  # compressed bytes per zstd decompress call (see _ZstdReader)


def _open_binary(path: Path) -> BinaryIO:
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a text file")
    try:
        raw = os.fdopen(open_regular(path), "rb")  # a fifo or a device is refused, never read
    except UnsafeFile as exc:
        raise DataError(f"{exc}; a data file must be a regular file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if suffix == ".xz":
        return lzma.LZMAFile(raw, mode="rb")
    if suffix == ".bz2":
        return bz2.BZ2File(raw, mode="rb")
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise DataError(
                f"{path}: reading .zst needs the zstandard package (pip install zstandard), "
                "or decompress the file first"
            ) from None
        return io.BufferedReader(_ZstdReader(raw, zstandard.ZstdDecompressor()))
    return raw


class _ZstdReader(io.RawIOBase):
    """zstd frames decoded as they are read, in bounded pieces. A stream that ends inside a frame
    is an error: zstandard's own stream_reader returns the decoded part silently, which would cut
    a corpus. Its decompressobj has no output limit, so it is fed ZSTD_STEP compressed bytes at a
    time: a zstd block decodes to at most 128 KiB and takes at least 4 bytes, so one call gives at
    most (ZSTD_STEP / 4 + 1) x 128 KiB (8.1 MiB), whatever the ratio (a 65 KB file expanding to
    2 GiB was decoded a 64 KiB read at a time: 3 GB in 10 s). What it gives is handed out through a
    memoryview, never copied again (slicing the bytes left on every read was quadratic)."""

    def __init__(self, raw: BinaryIO, decompressor):
        import zstandard

        self._raw, self._zstd, self._error = raw, decompressor, zstandard.ZstdError
        self._d = decompressor.decompressobj()
        self._input, self._at = b"", 0  # compressed bytes read, and how far they were fed
        self._output = memoryview(b"")  # decoded, not yet handed out

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._output:
            if self._at >= len(self._input):
                self._input, self._at = self._raw.read(1 << 16), 0
                if not self._input:
                    if not self._d.eof:
                        raise OSError("the zstd stream ends inside a frame (file cut short?)")
                    return 0
            if self._d.eof:  # concatenated frames, as `zstd` writes for appended files
                self._d = self._zstd.decompressobj()
            piece = memoryview(self._input)[self._at : self._at + ZSTD_STEP]
            try:
                self._output = memoryview(self._d.decompress(piece))
            except self._error as exc:  # bytes that are not zstd (after the last frame, or inside one)
                raise OSError(str(exc)) from None
            # The next frame starts where this one ended, inside the piece or after it.
            self._at += len(piece) - (len(self._d.unused_data) if self._d.eof else 0)
        n = min(len(buffer), len(self._output))
        buffer[:n], self._output = self._output[:n], self._output[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def text_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, without their line ends (and without a leading BOM).
    Refused with file and line: a file that is empty, not UTF-8, binary (NUL bytes), or has a
    line over MAX_LINE_BYTES; a damaged compressed file."""
    with _open_binary(path) as f:
        number = 0
        try:
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                number += 1
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise DataError(
                        f"{path}: line {number}: longer than {MAX_LINE_BYTES >> 20} MiB; "
                        "is the file one sentence a line?"
                    )
                if b"\x00" in raw:
                    raise DataError(f"{path}: line {number}: NUL bytes: binary data, expected UTF-8 text")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(
                        f"{path}: line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                        f"column {exc.start + 1})"
                    ) from None
                if number == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                yield line.rstrip("\n").rstrip("\r")
        except (OSError, EOFError, lzma.LZMAError) as exc:
            kind = COMPRESSED.get(path.suffix.lower(), "file")
            raise DataError(f"{path}: after line {number}: cannot read the {kind} data ({exc})") from None
        if number == 0:
            raise DataError(f"{path}: file is empty")


def tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    """(source, target) from a file of `source<TAB>target` lines."""
    for number, line in enumerate(text_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{path}: line {number}: expected 2 tab-separated fields (source, target), found {len(fields)}"
            )
        yield fields[0], fields[1]


def aligned_pairs(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """(source, target) from two line-aligned files; a different number of lines is refused,
    with both counts, when the shorter file ends."""
    src, tgt = text_lines(src_path), text_lines(tgt_path)
    count = 0
    for s in src:
        t = next(tgt, None)
        if t is None:
            rest = 1 + sum(1 for _ in src)
            raise DataError(
                f"{src_path} has {count + rest} lines but {tgt_path} has {count}: "
                "a parallel corpus needs the same number of lines in both"
            )
        count += 1
        yield s, t
    rest = sum(1 for _ in tgt)
    if rest:
        raise DataError(
            f"{src_path} has {count} lines but {tgt_path} has {count + rest}: "
            "a parallel corpus needs the same number of lines in both"
        )


# ------------------------------------------------------------------ a recipe's splits
def pairs_of(split) -> tuple[Iterator[tuple[str, str]], str]:
    """A split of the user's corpus (a FileSplit of the data section) as a stream of pairs, and
    what to call it in messages. The files are checked for existence now, so a typo fails before
    any work."""
    paths = [Path(split.tsv)] if split.tsv is not None else [Path(split.src), Path(split.tgt)]
    for path in paths:
        if not path.exists():
            raise DataError(f"{path}: file not found")
    if split.tsv is not None:
        return tsv_pairs(paths[0]), str(paths[0])
    return aligned_pairs(*paths), f"{paths[0]} / {paths[1]}"


def user_splits(files) -> dict:
    """{split: (pairs, origin)} of the data section's `files`: the training split as its corpora
    (TrainingCorpus, in order), the others as streams."""
    corpora = [TrainingCorpus(spec.label, spec.weight, *pairs_of(spec)) for spec in files.train_corpora]
    return {
        "train": (corpora, ", ".join(c.origin for c in corpora)),
        "valid": pairs_of(files.valid),
        **{name: pairs_of(spec) for name, spec in files.test.items()},
    }
