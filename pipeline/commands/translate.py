"""`pipeline translate`: stdin lines to stdout lines, in batches.

Every input line gives exactly one output line: empty lines stay empty, invalid UTF-8 is
replaced (with a warning), control characters are dropped, over-long lines are truncated to the
model's limit with a warning. Whatever the tokenizer's decoder emits, an output line holds no
line break (\n, \r, U+2028 and the others str.splitlines() splits on become spaces:
mt_runtime/lines.py).

Input is read in bounded pieces: a line longer than --max-line-bytes (DEFAULT_MAX_LINE_BYTES,
16 KiB: far more than the model's max_positions tokens) is cut to its first that many bytes (at
a UTF-8 character boundary), the rest of it is skipped without being kept, and one warning goes
to stderr; so memory stays bounded whatever one line holds.

Closed pipes end quietly: standard input or output closed at the start (`<&-`, `>&-`) is one
line, exit 2; a reader that goes away (`| head -1`) ends the command with no message and status
141, as a process SIGPIPE ended (pipeline/commands/cli.py); a write that fails (`> /dev/full`) is one line
naming the error, exit 1.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import BinaryIO, Iterator, TextIO

from mt_runtime.lines import one_line
from rich.markup import escape
from rich.progress import Progress, TextColumn

from ..corpora.splits import DEFAULT_MAX_LINE_BYTES, normalize
from ..engine.context import console
from ..engine.errors import IntegrityError, OutputError, ReaderGone, UserInputError
from ..engine.machine import usable_cores
from ..engine.store import MANIFEST, Store
from ..measure.translators import kind_of, open_model

# An artifact's package when none is named: int8_static first, the faster int8 at every point
# measured against CTranslate2 with the same BLEU (docs/results.md, issue 52).
DEFAULT_PACKAGES = ("int8_static", "int8_dynamic", "fp32", "fp16")
_SKIP_CHUNK = 1 << 16


def resolve_model(store: Store, ref: str, package: str | None) -> Path:
    """The model folder `ref` names (a folder, or an artifact and the package in it), its
    artifact verified. What makes a folder a model is the registry's (mt_runtime/registry.py)."""
    path = Path(ref)
    if not path.is_dir():
        path = store.resolve(ref).path
    if (path / MANIFEST).is_file():  # an artifact: never load one whose files do not match
        problems = store.verify_artifact(store.resolve(str(path)))
        if problems:
            raise IntegrityError(
                f"refusing to load {path}: {problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            )
    if package:
        if kind_of(path / package) is None:
            raise UserInputError(f"{path}: has no package {package!r} (has: {', '.join(_packages(path)) or 'none'})")
        return path / package
    if kind_of(path) is not None:
        return path
    found = _packages(path)
    for name in DEFAULT_PACKAGES:
        if name in found:
            return path / name
    raise UserInputError(f"{ref}: not a model (no model.safetensors, no encoder.onnx, no packages inside)")


def _packages(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir() and kind_of(p) is not None)


def bounded_lines(stdin: BinaryIO, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Each line of stdin without its newline, cut to at most max_bytes (at a UTF-8 character
    boundary), and whether it was cut. Never holds more than max_bytes + 64 KiB of one line."""
    while True:
        raw = stdin.readline(max_bytes + 1)
        if not raw:
            return
        if raw.endswith(b"\n"):
            yield raw[:-1], False
        elif len(raw) <= max_bytes:  # the last line, without a newline
            yield raw, False
        else:
            while (rest := stdin.readline(_SKIP_CHUNK)) and not rest.endswith(b"\n"):
                pass
            yield _utf8_prefix(raw[:max_bytes]), True


def _utf8_prefix(data: bytes) -> bytes:
    """data without a UTF-8 sequence cut off at its end."""
    j = len(data) - 1
    while j >= 0 and len(data) - j <= 4 and 0x80 <= data[j] < 0xC0:
        j -= 1
    if j >= 0 and data[j] >= 0xC0:
        need = 2 if data[j] < 0xE0 else 3 if data[j] < 0xF0 else 4
        if len(data) - j < need:
            return data[:j]
    return data


def translate_stream(
    store: Store,
    model: str,
    beam: int = 4,
    batch_size: int = 32,
    package: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
    stdin: BinaryIO | None = None,
    stdout: TextIO | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> None:
    if max_line_bytes < 1:
        raise UserInputError(f"--max-line-bytes must be at least 1, got {max_line_bytes}")
    if stdin is None and sys.stdin is None:  # started with `<&-`
        raise UserInputError("standard input is closed: nothing to translate (give the text on stdin)")
    if stdout is None and sys.stdout is None:  # started with `>&-`
        raise UserInputError("standard output is closed: nowhere to write the translations")
    threads = threads or usable_cores()  # all cores by default, as the benchmark's "all" row
    with store.reading():  # `artifacts gc` waits until this is done with the artifact
        translator = open_model(resolve_model(store, model, package), device=device, threads=threads)
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    block: list[str] = []
    done = {"lines": 0, "seconds": 0.0}
    progress = Progress(
        TextColumn("translating"),
        TextColumn("{task.completed} lines"),
        TextColumn("{task.fields[rate]}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task("translate", total=None, rate="")

    def flush():
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Batches as the benchmark forms them: length-sorted, batch_size sentences each, no
            # token cap (each sentence is already cut to the model's positions).
            out = translator.translate(block, beam=beam, max_batch=batch_size, batch_tokens=10**9)
        done["seconds"] += time.perf_counter() - start
        done["lines"] += len(block)
        for w in caught:
            console.print(f"[yellow]warning:[/yellow] {escape(str(w.message))}")
        if len(out) != len(block):
            raise IntegrityError(f"the translator returned {len(out)} lines for {len(block)}")
        try:
            stdout.write("".join(one_line(line) + "\n" for line in out))
            stdout.flush()
        except BrokenPipeError:
            raise ReaderGone() from None  # the command ends quietly (pipeline/commands/cli.py)
        except OSError as exc:
            raise OutputError(
                f"cannot write the translations to standard output: "
                f"{exc.strerror or exc} (after {done['lines'] - len(block)} lines)"
            ) from None
        block.clear()
        progress.update(task, completed=done["lines"], rate=f"{done['lines'] / done['seconds']:.1f} sentences/s")

    wall = time.perf_counter()
    counts = {"bad": 0, "cut": 0}  # lines with invalid UTF-8, lines cut to max_line_bytes
    with progress:
        _translate_lines(stdin, max_line_bytes, block, flush, batch_size, counts)
    bad_lines, cut_lines = counts["bad"], counts["cut"]
    if cut_lines > 1:
        console.print(
            f"[yellow]warning:[/yellow] {cut_lines} input lines were longer than {max_line_bytes} bytes and were cut"
        )
    if bad_lines:
        console.print(
            f"[yellow]warning:[/yellow] {bad_lines} input line(s) were not valid UTF-8; invalid bytes were replaced"
        )
    elapsed = time.perf_counter() - wall
    described = translator.describe()
    how = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("runtime", translator.runtime),
            ("search", described.get("batch_search")),
            ("threads", threads),
            ("beam", beam),
            ("batch", batch_size),
        )
        if v is not None
    )
    console.print(
        f"{done['lines']} lines in {elapsed:.2f} s: {done['lines'] / elapsed if elapsed else 0:.1f} "
        f"sentences/s ({done['lines'] / done['seconds'] if done['seconds'] else 0:.1f} while translating; "
        f"{how})",
        markup=False,
    )


def _translate_lines(
    stdin: BinaryIO, max_line_bytes: int, block: list[str], flush, batch_size: int, counts: dict
) -> None:
    """Read stdin's lines into `block`, flushing every batch_size x 8 of them and at the end."""
    for number, (raw, cut) in enumerate(bounded_lines(stdin, max_line_bytes), 1):
        if cut:
            counts["cut"] += 1
            if counts["cut"] == 1:
                console.print(
                    f"[yellow]warning:[/yellow] input line {number} is longer than {max_line_bytes} bytes: "
                    f"translating its first {max_line_bytes} bytes (--max-line-bytes)"
                )
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            counts["bad"] += 1
        block.append(normalize(text))
        if len(block) >= batch_size * 8:
            flush()
    if block:
        flush()
