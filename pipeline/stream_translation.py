"""`pipeline translate`: stdin lines to stdout lines, in batches.

Every input line gives exactly one output line: empty lines stay empty, invalid UTF-8 is
replaced (with a warning), control characters are dropped, over-long lines are truncated to the
model's limit with a warning. Whatever the tokenizer's decoder emits, an output line holds no
line break (\n, \r, U+2028 and the others str.splitlines() splits on become spaces).

Input is read in bounded pieces: a line longer than --max-line-bytes (DEFAULT_MAX_LINE_BYTES,
16 KiB: far more than the model's max_positions tokens) is cut to its first that many bytes (at
a UTF-8 character boundary), the rest of it is skipped without being kept, and one warning goes
to stderr; so memory stays bounded whatever one line holds.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import BinaryIO, Iterator, TextIO

from .context import console
from .corpus import DEFAULT_MAX_LINE_BYTES, normalize
from .errors import IntegrityError, UserInputError
from .store import MANIFEST, Store
from .model_loading import is_onnx_package, is_torch_model, load_translator

DEFAULT_PACKAGES = ("int8_dynamic", "fp32", "int8_static", "fp16")
# Every character str.splitlines() ends a line at: none may reach an output line.
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_SKIP_CHUNK = 1 << 16


def resolve_model(store: Store, ref: str, package: str | None) -> tuple[Path, str | None]:
    path = Path(ref)
    if not path.is_dir():
        path = store.resolve(ref).path
    if (path / MANIFEST).is_file():  # an artifact: never load one whose files do not match
        problems = store.verify_artifact(store.resolve(str(path)))
        if problems:
            raise IntegrityError(f"refusing to load {path}: {problems[0]}"
                                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    if package:
        if not (is_onnx_package(path / package) or is_torch_model(path / package)):
            raise UserInputError(f"{path}: has no package {package!r} (has: {', '.join(_packages(path)) or 'none'})")
        return path, package
    if is_torch_model(path) or is_onnx_package(path):
        return path, None
    found = _packages(path)
    for name in DEFAULT_PACKAGES:
        if name in found:
            return path, name
    raise UserInputError(f"{ref}: not a model (no model.safetensors, no encoder.onnx, no packages inside)")


def _packages(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir() and (is_onnx_package(p) or is_torch_model(p)))


def one_line(text: str) -> str:
    """text with every line break replaced by a space: one output line per input line."""
    return _LINE_BREAKS.sub(" ", text)


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


def translate_stream(store: Store, model: str, beam: int = 4, batch_size: int = 32, package: str | None = None,
                     device: str = "cpu", threads: int | None = None, stdin: BinaryIO | None = None,
                     stdout: TextIO | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
    if max_line_bytes < 1:
        raise UserInputError(f"--max-line-bytes must be at least 1, got {max_line_bytes}")
    with store.reading():  # `artifacts gc` waits until this is done with the artifact
        folder, package = resolve_model(store, model, package)
        translator = load_translator(folder, package, device=device, threads=threads)
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    bad_lines = cut_lines = 0
    block: list[str] = []

    def flush():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = translator.translate(block, beam=beam, max_batch=batch_size)
        for w in caught:
            console.print(f"[yellow]warning:[/yellow] {w.message}")
        if len(out) != len(block):
            raise IntegrityError(f"the translator returned {len(out)} lines for {len(block)}")
        stdout.write("".join(one_line(line) + "\n" for line in out))
        stdout.flush()
        block.clear()

    for number, (raw, cut) in enumerate(bounded_lines(stdin, max_line_bytes), 1):
        if cut:
            cut_lines += 1
            if cut_lines == 1:
                console.print(f"[yellow]warning:[/yellow] input line {number} is longer than {max_line_bytes} bytes: "
                              f"translating its first {max_line_bytes} bytes (--max-line-bytes)")
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            bad_lines += 1
        block.append(normalize(text))
        if len(block) >= batch_size * 8:
            flush()
    if block:
        flush()
    if cut_lines > 1:
        console.print(f"[yellow]warning:[/yellow] {cut_lines} input lines were longer than {max_line_bytes} bytes "
                      "and were cut")
    if bad_lines:
        console.print(f"[yellow]warning:[/yellow] {bad_lines} input line(s) were not valid UTF-8; "
                      "invalid bytes were replaced")
