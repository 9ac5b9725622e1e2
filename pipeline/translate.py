"""`pipeline translate`: stdin lines to stdout lines, in batches.

Every input line gives exactly one output line: empty lines stay empty, invalid UTF-8 is
replaced (with a warning), control characters are dropped, over-long lines are truncated to the
model's limit with a warning.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import BinaryIO, TextIO

from .context import console
from .errors import IntegrityError, UserInputError
from .stages.data import normalize
from .store import MANIFEST, Store, verify_folder
from .translators import is_onnx_package, is_torch_model, load_translator

DEFAULT_PACKAGES = ("int8_dynamic", "fp32", "int8_static", "fp16")


def resolve_model(store: Store, ref: str, package: str | None) -> tuple[Path, str | None]:
    path = Path(ref)
    if not path.is_dir():
        path = store.resolve(ref).path
    if (path / MANIFEST).is_file():  # an artifact: never load one whose files do not match
        problems = verify_folder(path, json.loads((path / MANIFEST).read_text(encoding="utf-8")))
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


def translate_stream(store: Store, model: str, beam: int = 4, batch_size: int = 32, package: str | None = None,
                     device: str = "cpu", threads: int | None = None, stdin: BinaryIO | None = None,
                     stdout: TextIO | None = None) -> None:
    folder, package = resolve_model(store, model, package)
    translator = load_translator(folder, package, device=device, threads=threads)
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    bad_lines = 0
    block: list[str] = []

    def flush():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = translator.translate(block, beam=beam, max_batch=batch_size)
        for w in caught:
            console.print(f"[yellow]warning:[/yellow] {w.message}")
        stdout.write("".join(line + "\n" for line in out))
        stdout.flush()
        block.clear()

    for raw in stdin:
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            bad_lines += 1
        block.append(normalize(text))
        if len(block) >= batch_size * 8:
            flush()
    if block:
        flush()
    if bad_lines:
        console.print(f"[yellow]warning:[/yellow] {bad_lines} input line(s) were not valid UTF-8; "
                      "invalid bytes were replaced")
