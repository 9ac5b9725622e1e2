"""The `mt-runtime` command: `translate PACKAGE` (standard input's lines to standard output's,
mt_runtime/translate_stream.py, as `pipeline translate` does) and `serve PACKAGE` (HTTP,
mt_runtime/serve.py, its command line in serve_settings.py).

Exit codes as `pipeline translate`'s: 0 ok; 1 a failure (a package failing its checks, a write
that failed); 2 bad input (an argument, a folder that is not a package, a standard stream closed
at the start); 130 interrupted; 141 the reader of standard output went away (128 + SIGPIPE, no
message). Every error is one line on stderr, "error: ...". Standard library only until a command
runs: `--help` answers without onnxruntime or aiohttp.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from . import translate_stream as stream
from ._version import __version__
from .layout import PACKAGE_JSON
from .lines import MAX_LINE_BYTES
from .serve_settings import OneLineParser, add_serve, cores, positive


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="mt-runtime", description="Translate with an ONNX translation package.")
    top.add_argument("--version", action="version", version=f"mt-runtime {__version__}")
    commands = top.add_subparsers(dest="command", required=True)
    add_serve(commands).set_defaults(run=_serve)
    _add_translate(commands).set_defaults(run=_translate)
    return top


def _add_translate(commands) -> argparse.ArgumentParser:
    p = commands.add_parser(
        "translate",
        help="translate standard input's lines to standard output",
        description="Translate standard input's lines to standard output, one output line per input line "
        "(an empty line stays empty); warnings and the summary go to stderr.",
    )
    p.add_argument("package", type=Path, help="the package folder")
    p.add_argument("--beam", type=positive(int), default=4, help="beam size (1 = greedy; default %(default)s)")
    p.add_argument(
        "--batch-size", type=positive(int), default=32, help="sentences translated together (default %(default)s)"
    )
    p.add_argument("--device", choices=stream.DEVICES, default="cpu", help="where to run (default %(default)s)")
    p.add_argument(
        "--threads",
        type=positive(int),
        default=None,
        help="onnxruntime intra-op threads (of each process with --processes; default: the cores this process "
        "may run on, divided among the processes)",
    )
    p.add_argument(
        "--processes",
        type=positive(int),
        default=None,
        help="child processes that translate whole batches at once, one each (default: none, this process; "
        "docs/serving.md, Using the cores)",
    )
    p.add_argument(
        "--max-line-bytes",
        type=positive(int),
        default=MAX_LINE_BYTES,
        help="longest input line read, in bytes; a longer one is cut to this many (with a warning) and still "
        "gives one output line (default %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.run(args)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    sys.exit(code)


def _serve(args: argparse.Namespace) -> int:
    from .serve import run

    return run(args)


def _translate(args: argparse.Namespace) -> int:
    line = _ProgressLine()
    try:
        stream.check_settings(
            args.beam, args.batch_size, args.max_line_bytes, args.device, args.threads, args.processes
        )
        stdin, stdout = stream.standard_streams()
        threads = stream.threads_of(args.threads, args.processes, cores())  # as `pipeline translate`
        translator = _open(args.package, args.device, threads, line.warn, args.processes)
        counts = stream.translate_lines(
            translator, stdin, stdout, args.beam, args.batch_size, args.max_line_bytes, line.warn, line.show
        )
    except (stream.ReaderGone, BrokenPipeError):
        stream.discard_stdout()
        return 128 + signal.SIGPIPE
    except stream.StreamError as exc:
        if isinstance(exc, stream.OutputFailed):
            stream.discard_stdout()
        line.clear()
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    line.clear()
    sys.stderr.write(stream.summary(counts, translator, threads, args.beam, args.batch_size) + "\n")
    return 0


def _open(folder: Path, device: str, threads: int, warn, processes: int | None = None):
    """The package's Translator; a folder that is not one is bad input (2), a package failing its
    checks a failure (1), as `pipeline translate` has them."""
    from .translator import PackageError, Translator

    if not folder.is_dir():
        raise stream.BadInput(f"{folder}: no such folder")
    if not (folder / PACKAGE_JSON).is_file():
        raise stream.BadInput(f"{folder}: not a package folder (no {PACKAGE_JSON})")
    try:
        return stream.opened(lambda: Translator(folder, device=device, threads=threads, processes=processes), warn)
    except PackageError as exc:
        raise stream.StreamError(str(exc)) from None


class _ProgressLine:
    """Lines translated and how fast, one line on a terminal's stderr rewritten after each write
    and cleared before anything else is written there; nothing where stderr is not a terminal."""

    def __init__(self):
        self.shown = False
        self.show = self._show if sys.stderr.isatty() else None

    def _show(self, counts: stream.Counts) -> None:
        sys.stderr.write(f"\rtranslating: {counts.lines} lines, {stream.speed(counts):.1f} sentences/s")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            self.shown = False

    def warn(self, message: str) -> None:
        self.clear()
        sys.stderr.write(f"warning: {message}\n")
