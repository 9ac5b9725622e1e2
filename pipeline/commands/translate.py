"""`pipeline translate`: stdin lines to stdout lines, in batches, with any model the pipeline
knows (an artifact id, an artifact folder, a package or another model folder).

The reading, cleaning, batching, writing, warnings, summary and errors are mt-runtime's
(mt_runtime/translate_stream.py), shared with `mt-runtime translate PACKAGE`, so the two commands
give the same lines and the same messages; here are only how a model is found and opened and the
progress bar. The stream's errors become the pipeline's (exit 2 bad input, 1 a failure; a reader
gone away ends quietly with 141: pipeline/commands/cli.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from mt_runtime import translate_stream as stream
from mt_runtime.lines import MAX_LINE_BYTES
from rich.markup import escape
from rich.progress import Progress, TextColumn

from ..engine.context import console
from ..engine.errors import IntegrityError, OutputError, ReaderGone, UserInputError
from ..engine.machine import usable_cores
from ..engine.store import MANIFEST, Store
from ..measure.translators import is_onnx_package, kind_of, open_model

# An artifact's package when none is named: int8_static first, the faster int8 at every point
# measured against CTranslate2 with the same BLEU (docs/results.md, issue 52).
DEFAULT_PACKAGES = ("int8_static", "int8_dynamic", "fp32", "fp16")


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


def translate_stream(
    store: Store,
    model: str,
    beam: int = 4,
    batch_size: int = 32,
    package: str | None = None,
    device: str = "cpu",
    threads: int | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    processes: int | None = None,
) -> None:
    """mt_runtime/translate_stream.py's, with a model found by artifact id, folder or package,
    its errors as the pipeline's, and a progress bar on a terminal. `processes`: an ONNX package's
    batches in that many child processes (mt-runtime's Translator(processes=N))."""
    with _as_pipeline_errors():
        stream.check_settings(beam, batch_size, max_line_bytes, device, threads, processes)
        stdin, stdout = stream.standard_streams()
    # all cores by default, as the benchmark's "all" row; with processes, divided among them
    threads = stream.threads_of(threads, processes, usable_cores())
    with store.reading():  # `artifacts gc` waits until this is done with the artifact
        folder = resolve_model(store, model, package)
        options = {}
        if processes:
            if not is_onnx_package(folder):
                kind = kind_of(folder).name
                raise UserInputError(f"--processes: ONNX packages only, and {folder} is a {kind} folder")
            options["processes"] = processes
        translator = stream.opened(lambda: open_model(folder, device=device, threads=threads, **options), _warn)
    progress = Progress(
        TextColumn("translating"),
        TextColumn("{task.completed} lines"),
        TextColumn("{task.fields[rate]}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task("translate", total=None, rate="")
    with progress, _as_pipeline_errors():
        counts = stream.translate_lines(
            translator,
            stdin,
            stdout,
            beam,
            batch_size,
            max_line_bytes,
            warn=_warn,
            progress=lambda c: progress.update(task, completed=c.lines, rate=f"{stream.speed(c):.1f} sentences/s"),
        )
    console.print(stream.summary(counts, translator, threads, beam, batch_size), markup=False)


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {escape(message)}")


@contextmanager
def _as_pipeline_errors():
    """The shared stream's errors as the pipeline's, for its exit codes and ending (cli.py)."""
    try:
        yield
    except stream.ReaderGone:
        raise ReaderGone() from None  # the command ends quietly (pipeline/commands/cli.py)
    except stream.OutputFailed as exc:
        raise OutputError(str(exc)) from None
    except stream.BadInput as exc:
        raise UserInputError(str(exc)) from None
    except stream.StreamError as exc:
        raise IntegrityError(str(exc)) from None
