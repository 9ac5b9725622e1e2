"""What a stage sees: its typed config, its input artifacts, a folder to write, and a way to
report progress. Nothing about where the store keeps things."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, highlight=False)

# Seconds between progress lines when the output is not a terminal; a worker process whose
# output a runner relays (pipeline/engine/workers.py) is given a shorter interval here.
PROGRESS_EVERY_ENV = "PIPELINE_PROGRESS_EVERY_S"


def _progress_every_s() -> float:
    try:
        return max(0.5, float(os.environ.get(PROGRESS_EVERY_ENV, "30")))
    except ValueError:
        return 30.0


class ProgressHandle:
    """One bar. On a terminal it is a rich bar; in a log (CI, nohup) it prints a line now and then."""

    def __init__(
        self,
        progress: Progress | None,
        task,
        description: str,
        total: float | None,
        unit: str,
        log_every_s: float = 30.0,
    ):
        self._progress, self._task = progress, task
        self.description, self.total, self.unit = description, total, unit
        self.done = 0.0
        self._start = self._last_log = time.monotonic()
        self._log_every = log_every_s
        self.postfix = ""

    def advance(self, amount: float = 1.0, postfix: str | None = None) -> None:
        self.done += amount
        if postfix is not None:
            self.postfix = postfix
        if self._progress is not None:
            self._progress.update(self._task, advance=amount, description=f"{self.description} {self.postfix}".rstrip())
        elif time.monotonic() - self._last_log >= self._log_every:
            self._last_log = time.monotonic()
            of = f"/{self.total:g}" if self.total else ""
            console.print(
                f"  {self.description}: {self.done:g}{of} {self.unit} "
                f"({time.monotonic() - self._start:.0f} s) {self.postfix}".rstrip()
            )

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start


@contextlib.contextmanager
def progress_bar(description: str, total: float | None = None, unit: str = "") -> Iterator[ProgressHandle]:
    if not console.is_terminal:
        yield ProgressHandle(None, None, description, total, unit, log_every_s=_progress_every_s())
        return
    columns = [
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield ProgressHandle(progress, task, description, total, unit)


@dataclass
class StageContext:
    name: str  # the node: "teacher", "evaluate.pruned"
    settings: Any  # typed config section (pydantic) or plain data
    config: Any  # the plain config that was fingerprinted
    inputs: Any  # the stage's Inputs (its declaration's): ctx.inputs.data, ctx.inputs.teacher (None if not read)
    out: Path  # write the artifact's files here (a temporary folder, renamed when complete)
    work: Path  # scratch that survives a crash (checkpoints); deleted after success
    nproc: int = 1  # processes for stages that can use several (training, corpus translation)
    # Cores this stage may use when the runner builds it side by side with others (None: all).
    cores: int | None = None
    events: list[dict] = field(default_factory=list)
    # Where `status` lines go instead of the console (the runner's live display of side-by-side builds).
    on_status: Callable[[str], None] | None = None
    # What an earlier build of this same artifact id chose by measuring the machine (the recipe's
    # lock file), to be used instead of measuring again; None where nothing was recorded. A stage
    # that measures returns its choices as metrics["choices"] (a dict), which the lock records.
    recorded: dict | None = None

    def log(self, message: str, *, markup: bool = False, **data: Any) -> None:
        """A line for the user, also kept in the run log, shown as it is: messages carry names and
        paths the user chose (a store called `st[/bold]ore`), whose brackets are not rich markup.
        markup=True only for a message built of markup and escaped text."""
        console.print(f"  [dim]{self.name}:[/dim] {message if markup else escape(message)}")
        self.events.append({"time": time.time(), "message": message, **data})

    def status(self, text: str) -> None:
        """A passing progress line (not kept in the run log)."""
        if self.on_status is not None:
            self.on_status(text)
        else:
            console.print(f"  [dim]{self.name}:[/dim] {escape(text)}")

    def progress(self, description: str, total: float | None = None, unit: str = ""):
        return progress_bar(description, total, unit)
