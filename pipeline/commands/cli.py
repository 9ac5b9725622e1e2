"""The `pipeline` command. Exit codes: 0 ok, 1 a run or check failed, 2 bad input, 141 the reader of
stdout went away (128 + SIGPIPE, no message)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from mt_runtime.lines import MAX_LINE_BYTES
from mt_runtime.translate_stream import discard_stdout as _discard_stdout
from rich.errors import MarkupError
from rich.markup import escape
from rich.table import Table

from ..engine.context import console
from ..engine.errors import OutputError, PipelineError, ReaderGone, RecipeError, UserInputError, no_room
from ..engine.store import Store

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Distil, prune, quantize and export Transformer translation models from one recipe.",
)
artifacts_app = typer.Typer(no_args_is_help=True, help="Inspect, verify and clean the artifact store.")
app.add_typer(artifacts_app, name="artifacts")

StoreOpt = Annotated[
    Optional[Path], typer.Option("--store", help="Artifact store folder (default: $PIPELINE_ARTIFACTS or ./artifacts).")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a recipe value, e.g. --set teacher.train.max_epochs=2 (repeatable)."),
]
RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.")]


def _store(path: Optional[Path]) -> Store:
    return Store(path)


# ---------------------------------------------------------------------------------- run
@app.command()
def run(
    recipe: RecipeArg,
    set_: SetOpt = None,
    until: Annotated[
        Optional[str],
        typer.Option(
            help="Stop after this stage (a stage kind such as 'evaluate', or a node such as 'evaluate.teacher')."
        ),
    ] = None,
    force: Annotated[
        Optional[list[str]],
        typer.Option(help="Rebuild this stage (and what depends on it) even if cached (repeatable)."),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the store lock instead of failing.")] = False,
    nproc: Annotated[
        int,
        typer.Option(min=1, help="Processes for training and corpus translation (torchrun; gloo on CPU, nccl on GPU)."),
    ] = 1,
    store: StoreOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Build nothing: say what would be built and how long it would take here "
            "(trainings measured by a short probe).",
        ),
    ] = False,
) -> None:
    """Build every artifact of the recipe that is not already in the store."""
    from ..engine.runner import run as run_plan
    from ..engine.runner import summary_table
    from . import plan_recipe

    started = time.monotonic()
    plan = plan_recipe(recipe, set_ or [])
    st = _store(store)
    if dry_run:
        _dry_run(plan, st, until)
        return
    console.print(
        f"recipe [bold]{escape(plan.name)}[/bold] ({escape(str(recipe))}), store {escape(str(st.root))}"
        + (f", overrides: {escape(' '.join(set_))}" if set_ else "")
    )
    result = run_plan(plan, st, until=until, force=force or [], wait=wait, nproc=nproc)
    console.print(summary_table(result, time.monotonic() - started))


def _dry_run(plan, st: Store, until: str | None) -> None:
    from ..engine.graph import select
    from ..engine.machine import machine_info
    from .estimate import estimate

    machine = machine_info()
    console.print(
        f"recipe [bold]{escape(plan.name)}[/bold]: estimating on this machine "
        f"({escape(str(machine['cpu']))}, {machine['isa']}, {machine['cores']} cores); nothing is built"
    )
    selected = select(plan.nodes, until)
    rows = estimate(plan, st, selected, log=lambda line: console.print(line, style="dim", markup=False))
    by_name = {n.name: n for n in selected}
    table = Table(title_justify="left")
    for col in ("stage", "estimate", "how"):
        table.add_column(col)
    total, unknown, counted = 0.0, [], set()
    for row in rows:
        shown = "–" if row.seconds is None else ("cached" if row.how == "cached" else _minutes(row.seconds))
        table.add_row(row.node, shown, escape(row.how))
        if row.seconds is None:
            unknown.append(row.node)
            continue
        group = by_name[row.node].side_by_side or (row.node,)  # built side by side: the longer of the pair
        if row.node not in counted:
            total += max(r.seconds or 0.0 for r in rows if r.node in group)
            counted.update(group)
    table.title = f"about {_minutes(total)} on this machine" + (
        f", plus {len(unknown)} stage(s) not estimated" if unknown else ""
    )
    console.print(table)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@app.command()
def status(
    recipe: RecipeArg,
    set_: SetOpt = None,
    store: StoreOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per stage.")] = False,
) -> None:
    """Per stage: cached, stale (with the reason) or missing."""
    from ..engine.runner import choices_text, node_status
    from . import plan_recipe

    plan = plan_recipe(recipe, set_ or [])
    rows = node_status(_store(store), plan)
    if json_out:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(
        title=f"{escape(plan.name)}: {sum(r['state'] == 'cached' for r in rows)}/{len(rows)} cached",
        title_justify="left",
    )
    # Choices: what a build measured on the machine (a training's threads, precision, kernels),
    # and whether it measured them then or took those the recipe's lock recorded for its id.
    with_choices = any(row.get("choices") for row in rows)
    for col in ("stage", "state", "artifact", "reason") + (("choices",) if with_choices else ()):
        table.add_column(col)
    colour = {"cached": "green", "stale": "yellow", "missing": "red"}
    for row in rows:
        cells = [row["node"], f"[{colour[row['state']]}]{row['state']}[/]", row["id"], escape(row["reason"])]
        table.add_row(*cells, *((escape(choices_text(row)),) if with_choices else ()))
    console.print(table)


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe without running anything."""
    from . import plan_recipe

    plan = plan_recipe(recipe, set_ or [])
    print(f"{recipe}: ok ({len(plan.nodes)} stages: {', '.join(n.name for n in plan.nodes)})")


# ---------------------------------------------------------------------------- artifacts
@artifacts_app.command("list")
def artifacts_list(
    store: StoreOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per artifact.")] = False,
) -> None:
    """Every artifact in the store."""
    st = _store(store)
    rows = st.listing()
    if json_out:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(title=f"{len(rows)} artifacts in {escape(str(st.root))}", title_justify="left")
    for col in ("id", "created", "size", "build time"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            escape(row["id"]),
            escape(row["created"]) if row["created"] else "[red]incomplete[/red]",
            _bytes(row["bytes"]),
            f"{row['duration_s']:.1f} s" if row["duration_s"] is not None else "",
        )
    console.print(table)


@artifacts_app.command("show")
def artifacts_show(
    artifact: Annotated[str, typer.Argument(help="Artifact id (or unique prefix).")], store: StoreOpt = None
) -> None:
    """Print an artifact's manifest."""
    print(json.dumps(_store(store).resolve(artifact).manifest, indent=2, sort_keys=True))


@artifacts_app.command("verify")
def artifacts_verify(
    artifact: Annotated[
        Optional[str],
        typer.Argument(
            help="Artifact id, or the path of an artifact folder (checked against its own manifest and, "
            "when the store holds its id, against the store's digests); all artifacts if omitted."
        ),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Check every file against its manifest's size and sha256. Exit 1 on any mismatch."""
    st = _store(store)
    bad = total = 0
    targets = [st.resolve(artifact)] if artifact else [p.name for p in st.list_dirs()]
    for target in targets:
        total += 1
        if isinstance(target, str):
            label = target
            problems = st.verify(target) if st.exists(target) else [f"{st.path_of(target)}: no manifest (incomplete)"]
        else:
            label = target.id if st.in_store(target) else f"{target.path} ({target.id})"
            problems = st.verify_artifact(target)
        if problems:
            bad += 1
            console.print(f"[red]✗[/red] {escape(label)}")
            for line in problems:
                console.print(f"    {line}", markup=False)
        else:
            console.print(f"[green]✓[/green] {escape(label)}")
            if (
                not isinstance(target, str)
                and not st.in_store(target)
                and not (_is_id(target.id) and st.exists(target.id))
            ):
                console.print(
                    f"    checked against its own manifest only: {st.root} holds no copy of {target.id}", markup=False
                )
    console.print(f"{total - bad} ok, {bad} failed")
    if bad:
        raise typer.Exit(1)


def _is_id(text: str) -> bool:
    from ..engine.store import _ID_RE

    return bool(_ID_RE.match(text))


@artifacts_app.command("gc")
def artifacts_gc(
    store: StoreOpt = None,
    dry_run: Annotated[bool, typer.Option(help="Only list what would be removed.")] = False,
    drop_checkpoints: Annotated[
        bool,
        typer.Option(
            "--drop-checkpoints",
            help="Also remove the resume checkpoints (work/ folders) of stages that "
            "were interrupted; kept otherwise, so the same run resumes.",
        ),
    ] = False,
) -> None:
    """Remove artifacts that no recipe's latest run uses (and leftovers of crashed runs)."""
    verb = "would remove" if dry_run else "removed"
    result = _store(store).collect_garbage(
        dry_run,
        drop_checkpoints,
        on_remove=lambda path, size: console.print(f"{verb} {path} ({_bytes(size)})", markup=False),
    )
    console.print(
        f"{result.removed} artifact(s), {_bytes(result.freed_bytes)} "
        f"{'reclaimable' if dry_run else 'freed'}; kept {result.kept}"
    )
    if result.kept_checkpoints:
        console.print(
            f"kept {len(result.kept_checkpoints)} resume checkpoint folder(s) of interrupted stages "
            f"({_bytes(result.kept_checkpoint_bytes)}): run the recipe again to resume, "
            "or pass --drop-checkpoints to remove them"
        )
    for path in result.busy:
        console.print(f"kept {path}: in use by a live process", markup=False)


# ------------------------------------------------------------------------- use a model
@app.command()
def translate(
    model: Annotated[str, typer.Option(help="Model artifact id, artifact folder or exported package.")],
    beam: Annotated[int, typer.Option(min=1, help="Beam size (1 = greedy).")] = 4,
    batch_size: Annotated[int, typer.Option(min=1, help="Sentences per batch.")] = 32,
    package: Annotated[
        Optional[str],
        typer.Option(
            help="Package inside an export/quantize artifact (fp32, fp16, int8_dynamic, int8_static; "
            "default: int8_static, else int8_dynamic, fp32, fp16)."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    threads: Annotated[
        Optional[int], typer.Option(min=1, help="Intra-op threads (of each process with --processes).")
    ] = None,
    processes: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            help="Child processes that translate whole batches at once, one each (ONNX packages on the CPU; "
            "the report's 'On every core' lines say whether it is faster here).",
        ),
    ] = None,
    max_line_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Longest input line read, in bytes; a longer one is cut to this many "
            "(with a warning) and still gives one output line.",
        ),
    ] = MAX_LINE_BYTES,
    store: StoreOpt = None,
) -> None:
    """Translate lines from stdin to stdout: one output line per input line."""
    from .translate import translate_stream

    translate_stream(
        _store(store),
        model,
        beam=beam,
        batch_size=batch_size,
        package=package,
        device=device,
        threads=threads,
        max_line_bytes=max_line_bytes,
        processes=processes,
    )


@app.command("export-package")
def export_package(
    artifact: Annotated[str, typer.Argument(help="An export or quantize artifact.")],
    dest: Annotated[Path, typer.Argument(help="Folder to create.")],
    package: Annotated[
        Optional[str], typer.Option(help="Which package (fp32, fp16, int8_dynamic, int8_static); all if omitted.")
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Copy a shipped ONNX package out of the store."""
    from ..export.packages import copy_packages

    st = _store(store)
    with st.reading():  # `artifacts gc` waits until the copy is done
        written = copy_packages(st.resolve(artifact), dest, package)
    for path in written:
        console.print(f"wrote {path}", markup=False)


@app.command()
def report(
    recipe: Annotated[Optional[Path], typer.Argument(help="Recipe whose latest run to show.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print report.json.")] = False,
    compare: Annotated[Optional[tuple[str, str]], typer.Option(help="Compare two runs: --compare RUN_A RUN_B.")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the latest report as a section of docs/results.md.")
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Show the BLEU / latency table of a recipe's latest run, or compare two runs."""
    from .report_view import compare_runs, results_markdown, show_latest

    st = _store(store)
    if compare:
        compare_runs(st, *compare)
    elif recipe is not None and markdown:
        sys.stdout.write(results_markdown(st, recipe))
    elif recipe is not None:
        show_latest(st, recipe, json_out=json_out)
    else:
        raise UserInputError("give a recipe, or --compare RUN_A RUN_B")


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _click_modules() -> list:
    """click as typer uses it: typer 0.2x carries its own copy (typer._click), older ones use click;
    their exceptions are different classes, and a usage error must be caught whichever it is."""
    import importlib

    found = []
    for name in ("typer._click", "click"):
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            pass
    return found


def main() -> None:
    from rich.markup import escape

    clicks = _click_modules()
    aborts = tuple(c.exceptions.Abort for c in clicks if hasattr(c.exceptions, "Abort"))
    click_errors = tuple(c.exceptions.ClickException for c in clicks)

    def fail(line: str, code: int) -> None:
        console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
        sys.exit(code)

    def interrupted() -> None:
        # Ctrl-C: half-written artifacts are removed, checkpoints are kept.
        console.print(
            "[yellow]interrupted: nothing half-written was kept (training checkpoints were); "
            "run the same command again to resume[/yellow]",
            soft_wrap=True,
        )
        # os._exit, not sys.exit: when the interrupt lands while an extension runs Python code
        # through PyRun_*, CPython 3.11 flags it as unhandled (_Py_UnhandledKeyboardInterrupt)
        # even though it was caught here, and at shutdown kills itself with SIGINT, so the exit
        # status came out as -2 instead of 130 in about one run in ten on a loaded machine. The
        # run's own cleanup (temporary folders, the lock, the run log) is done by this point.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)

    try:
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, *aborts):
        interrupted()
    except RecipeError as exc:
        for line in exc.lines:
            console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except (BrokenPipeError, ReaderGone):
        # The reader went away (`| head -1`): quietly, with the status a shell gives a process
        # SIGPIPE ended (128 + 13), after the run's own cleanup; nothing more goes to the pipe.
        _discard_stdout()
        sys.exit(128 + signal.SIGPIPE)
    except OutputError as exc:
        _discard_stdout()
        fail(str(exc), exc.exit_code)
    except PipelineError as exc:
        fail(str(exc), exc.exit_code)
    except click_errors as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:  # a full disk met outside a stage (the run log, the lock file)
        if not (full := no_room(exc)):
            raise
        _discard_stdout()
        fail(f"no room to write ({full}); the store is unchanged: free some space and run again", 1)
    except MarkupError as exc:  # a last guard: text shown as markup that was not meant as markup
        fail(f"could not show a message ({exc}); this is a bug, please report it", 1)
    if code == 130:  # typer turns KeyboardInterrupt into exit code 130
        interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def _install_sigterm() -> None:
    # SIGTERM (e.g. a scheduler ending the job) is handled like Ctrl-C so temporary folders go.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


_install_sigterm()


if __name__ == "__main__":
    main()
