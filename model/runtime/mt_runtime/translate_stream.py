"""`translate`: standard input's lines to standard output's, in batches, with any TextTranslator.

One implementation for `mt-runtime translate PACKAGE` (mt_runtime/cli.py) and `pipeline translate`
(pipeline/commands/translate.py), so that the two give the same lines, warnings, summary and
errors; each command adds only how it finds the model and how it shows messages.

Every input line gives exactly one output line: empty lines stay empty, invalid UTF-8 is
replaced (with a warning), control characters are dropped, and the line is cleaned as the
pipeline's data stage cleans what it trains on (`lines.normalize`). An input line longer than
max_line_bytes is cut to its first that many bytes at a UTF-8 character boundary, the rest skipped
without being kept (one warning), so memory stays bounded whatever one line holds. Whatever the
tokenizer's decoder emits, an output line holds no line break (`lines.one_line`). Output is UTF-8
whatever the locale.

Closed pipes end quietly: standard input or output closed at the start (`<&-`, `>&-`) is
BadInput (exit 2) before any model is opened; a reader that goes away (`| head -1`) is ReaderGone,
which the commands end with no message and status 141, as a process SIGPIPE ended; a write that
fails (`> /dev/full`) is OutputFailed, one line naming the error (exit 1).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from typing import BinaryIO, Callable

from .lines import bounded_lines, normalize, one_line
from .registry import TextTranslator

DEVICES = ("cpu", "cuda")


class StreamError(Exception):
    """A failure the user can act on, one line; exit status 1 unless a subclass says otherwise."""

    exit_code = 1


class BadInput(StreamError):
    """A setting out of range, or a standard stream closed: exit status 2."""

    exit_code = 2


class OutputFailed(StreamError):
    """Standard output cannot be written (a full disk, an I/O error)."""


class ReaderGone(Exception):
    """The reader of standard output went away (`| head -1`): end quietly, status 141."""


@dataclasses.dataclass
class Counts:
    """What a run translated: lines, seconds inside the translator, seconds in all, input lines
    with invalid UTF-8 and input lines cut to max_line_bytes."""

    lines: int = 0
    translating: float = 0.0
    wall: float = 0.0
    bad: int = 0
    cut: int = 0


def check_settings(
    beam: int, batch_size: int, max_line_bytes: int, device: str, threads: int | None, processes: int | None = None
) -> None:
    """BadInput naming the first setting out of range (the commands' parsers refuse most of them
    first; this holds for a caller that passes them in code)."""
    for name, value in (("--beam", beam), ("--batch-size", batch_size), ("--max-line-bytes", max_line_bytes)):
        if value < 1:
            raise BadInput(f"{name} must be at least 1, got {value}")
    for name, value in (("--threads", threads), ("--processes", processes)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be at least 1, got {value}")
    if device not in DEVICES:
        raise BadInput(f"--device must be cpu or cuda, got {device!r}")
    if processes and device != "cpu":
        raise BadInput("--processes: batches run in child processes on the CPU only")


def threads_of(threads: int | None, processes: int | None, cores: int) -> int:
    """The intra-op threads of a translator (of each child with processes): as asked, else all
    the cores, divided among the processes."""
    return threads or max(1, cores // (processes or 1))


def opened(open_model: Callable[[], TextTranslator], warn: Callable[[str], None]) -> TextTranslator:
    """open_model(), what it warns of (CUDA asked for and unavailable, a graph that does not
    load with this onnxruntime) shown through `warn` as the stream's own warnings are."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        translator = open_model()
    for w in caught:
        warn(str(w.message))
    return translator


def standard_streams() -> tuple[BinaryIO, BinaryIO]:
    """sys.stdin's and sys.stdout's bytes, or BadInput where either was closed at the start."""
    if sys.stdin is None:  # started with `<&-`
        raise BadInput("standard input is closed: nothing to translate (give the text on stdin)")
    if sys.stdout is None:  # started with `>&-`
        raise BadInput("standard output is closed: nowhere to write the translations")
    return sys.stdin.buffer, sys.stdout.buffer


def lines_at_a_time(translator: TextTranslator, batch_size: int) -> int:
    """Lines one translate call gets: 8 batches, or twice the batches a translator of several
    threads or processes keeps at work (its `at_once`), so that each call's end, where its last
    batch leaves the others idle, is rarer (at 16 threads 8 batches would leave half of them
    idle; 2 threads, int8_static, 6028 lines greedy: 5-11% more sentences a second)."""
    return batch_size * max(8, 2 * getattr(translator, "at_once", 1))


def translate_lines(
    translator: TextTranslator,
    stdin: BinaryIO,
    stdout: BinaryIO,
    beam: int,
    batch_size: int,
    max_line_bytes: int,
    warn: Callable[[str], None],
    progress: Callable[[Counts], None] | None = None,
) -> Counts:
    """Translate stdin's lines to stdout, lines_at_a_time(...) read at a time; `warn` shows a
    warning (a line without its "warning: "), `progress` is told the counts after each write."""
    counts = Counts()
    block_lines = lines_at_a_time(translator, batch_size)
    block: list[str] = []
    wall = time.perf_counter()

    def flush() -> None:
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Batches as the benchmark forms them: length-sorted, batch_size sentences each, no
            # token cap (each sentence is already cut to the model's positions).
            out = translator.translate(block, beam=beam, max_batch=batch_size, batch_tokens=10**9)
        counts.translating += time.perf_counter() - start
        for w in caught:
            warn(str(w.message))
        if len(out) != len(block):
            raise StreamError(f"the translator returned {len(out)} lines for {len(block)}")
        try:
            stdout.write("".join(one_line(line) + "\n" for line in out).encode("utf-8", "replace"))
            stdout.flush()
        except BrokenPipeError:
            raise ReaderGone() from None
        except OSError as exc:
            raise OutputFailed(
                f"cannot write the translations to standard output: {exc.strerror or exc} (after {counts.lines} lines)"
            ) from None
        counts.lines += len(block)
        block.clear()
        if progress is not None:
            progress(counts)

    for number, (raw, cut) in enumerate(bounded_lines(stdin, max_line_bytes), 1):
        if cut:
            counts.cut += 1
            if counts.cut == 1:
                warn(
                    f"input line {number} is longer than {max_line_bytes} bytes: "
                    f"translating its first {max_line_bytes} bytes (--max-line-bytes)"
                )
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            counts.bad += 1
        block.append(normalize(text))
        if len(block) >= block_lines:
            flush()
    if block:
        flush()
    counts.wall = time.perf_counter() - wall
    if counts.cut > 1:
        warn(f"{counts.cut} input lines were longer than {max_line_bytes} bytes and were cut")
    if counts.bad:
        warn(f"{counts.bad} input line(s) were not valid UTF-8; invalid bytes were replaced")
    return counts


def speed(counts: Counts) -> float:
    """Sentences a second while translating."""
    return counts.lines / counts.translating if counts.translating else 0.0


def summary(counts: Counts, translator: TextTranslator, threads: int, beam: int, batch_size: int) -> str:
    """The last line on stderr: how many, how fast, and how."""
    how = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("runtime", translator.runtime),
            ("search", translator.describe().get("batch_search")),
            ("threads", threads),
            ("processes", translator.describe().get("processes") or None),
            ("beam", beam),
            ("batch", batch_size),
        )
        if v is not None
    )
    overall = counts.lines / counts.wall if counts.wall else 0.0
    return (
        f"{counts.lines} lines in {counts.wall:.2f} s: {overall:.1f} sentences/s "
        f"({speed(counts):.1f} while translating; {how})"
    )


def discard_stdout() -> None:
    """Point standard output at /dev/null: what is still buffered for a closed pipe or a full disk
    is dropped there, instead of failing again in the interpreter's flush at exit ("Exception
    ignored ... BrokenPipeError")."""
    if sys.stdout is None:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no descriptor to replace (stdout is not a file)
        pass
