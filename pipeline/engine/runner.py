"""Plan and execute a recipe: reuse every artifact whose fingerprint exists and verifies,
build the rest in dependency order, and log what happened."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.markup import escape
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .code_digest import changed_files
from .context import StageContext, console
from .errors import PipelineError, StageFailed, UserInputError, no_room
from .graph import Node, build_graph, resolve_builds, select
from .lockfile import content_digest, read_lock, recorded_choices, write_lock
from .machine import machine_info, usable_cores
from .recipe import load_recipe
from .stage import Stage
from .store import Store, now_iso, safe_name, tool_versions
from .workers import interrupt_children


@dataclass
class Plan:
    recipe: Any  # the registry's recipe schema
    raw: dict
    path: Path
    overrides: list[str]
    nodes: list[Node]  # every node of the recipe
    machine: dict
    lock_warned: bool = False  # the lock file could not be written, and the user was told once

    @property
    def name(self) -> str:
        return self.recipe.name


def make_plan(recipe_path: str | Path, overrides: list[str], stages: Sequence[Stage], schema: type) -> Plan:
    """The recipe read against `schema` and planned by `stages` (pipeline/stages: STAGES, Recipe).
    The machine enters the fingerprints of the stages whose numbers depend on it."""
    recipe, raw = load_recipe(recipe_path, list(overrides), schema)
    machine = machine_info()
    nodes = build_graph(recipe, recipe_path, stages, machine)
    rows = read_lock(recipe_path)
    for node in nodes:
        node.recorded = recorded_choices(rows, node.name, node.default_id)
    return Plan(recipe, raw, Path(recipe_path), list(overrides), nodes, machine)


# ------------------------------------------------------------------------------ status
def node_status(store: Store, plan: Plan) -> list[dict]:
    """Per node: cached / stale / missing, with the reason."""
    previous = (store.latest(plan.name, plan.path) or {}).get("nodes", {})
    resolve_builds(plan.nodes, store.current_build)
    by_name = {n.name: n for n in plan.nodes}
    rows = []
    cut: set[str] = set()  # nodes trained short by a time cap, and what was built from them
    for node in plan.nodes:
        if store.exists(node.id):
            artifact = store.get(node.id)
            reason = node.spec.cut_reason(artifact.metrics)
            upstream = sorted({up for up in node.inputs.values() if up in cut})
            if reason or upstream:
                cut.add(node.name)
            reason = reason or (f"built from {', '.join(upstream)}, cut by time" if upstream else "")
            rows.append({"node": node.name, "state": "cached", "id": node.id, "reason": reason, **_choices(artifact)})
            continue
        recorded = {"choices": node.recorded, "choices_from": "lock"} if node.recorded else {}
        before = previous.get(node.name)
        if before is None:
            rows.append({"node": node.name, "state": "missing", "id": node.id, "reason": "never built", **recorded})
            continue
        why = _why_changed(node, before, by_name)
        rows.append({"node": node.name, "state": "stale", "id": node.id, "reason": why, **recorded})
    return rows


def _choices(artifact) -> dict:
    """What a built artifact chose by measuring the machine, and whether it measured then
    ("measured") or took what the lock recorded for its id ("lock")."""
    choices = artifact.metrics.get("choices")
    if not isinstance(choices, dict):
        return {}
    return {"choices": choices, "choices_from": artifact.manifest.get("choices_from", "measured")}


def choices_text(row: dict) -> str:
    """A status row's choices in one line: 'speed bf16=False attention=math ... (recorded in the lock)'."""
    choices = row.get("choices")
    if not choices:
        return ""
    parts = [
        f"{key} " + " ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else f"{key}={value}"
        for key, value in choices.items()
        if key != "for"
    ]
    source = {
        "lock": "recorded in the lock" if row["state"] == "cached" else "from the lock when built",
        "measured": "measured when built",
    }
    return f"{'; '.join(parts)} ({source.get(row.get('choices_from'), row.get('choices_from'))})"


def _why_changed(node: Node, before: dict, by_name: dict[str, Node]) -> str:
    """Every difference from the build the recipe's last run recorded, or why it is gone."""
    reasons = []
    changed = _diff_keys(before.get("config"), node.config)
    if changed:
        reasons.append(f"config changed: {_first_few(changed)}")
    old_inputs = before.get("inputs", {})
    moved = [role for role, up in node.inputs.items() if old_inputs.get(role) != by_name[up].input_key]
    if moved:
        reasons.append("input changed: " + ", ".join(f"{r} ({node.inputs[r]})" for r in moved))
    if "code" not in before:  # recorded before code digests existed
        reasons.append("code changed (the last build predates code digests)")
    elif files := changed_files(before["code"], node.code):
        reasons.append(f"code changed: {_first_few(files)}")
    if before.get("version") != node.spec.version:
        reasons.append("stage version bumped")
    return "; ".join(reasons) or "artifact missing from the store"


def _first_few(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")


def _diff_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += _diff_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".") or "(whole config)"]


# --------------------------------------------------------------------------------- run
@dataclass
class RunResult:
    run_id: str
    records: list[dict] = field(default_factory=list)
    headline: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> its stage's `headline`
    ok: bool = True
    error: str | None = None


def run(
    plan: Plan, store: Store, until: str | None = None, force: list[str] = (), wait: bool = False, nproc: int = 1
) -> RunResult:
    selected = select(plan.nodes, until)
    forced = _forced(plan.nodes, selected, force)
    run_id = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{safe_name(plan.name)}-{secrets.token_hex(2)}"
    log = {
        "run": run_id,
        "recipe": plan.name,
        "recipe_path": str(plan.path),
        "overrides": plan.overrides,
        "recipe_resolved": plan.raw,
        "until": until,
        "force": list(force),
        "nproc": nproc,
        "started": now_iso(),
        "machine": plan.machine,
        "pid": os.getpid(),
        "nodes": [],
        "status": "running",
    }
    result = RunResult(run_id, headline={n.name: n.spec.headline for n in plan.nodes})
    started = time.monotonic()

    def on_wait(holder):
        console.print(
            f"[yellow]waiting for the store lock held by pid {holder.get('pid', '?')} "
            f"({escape(str(holder.get('command', '?')))})[/yellow]"
        )

    def on_stale(holder):
        console.print(
            f"[yellow]took over a stale store lock left by pid {holder.get('pid')} (that process is gone)[/yellow]"
        )

    with store.lock(wait=wait, on_wait=on_wait, on_stale=on_stale):
        leftovers = store.clean_tmp()
        if leftovers:
            console.print(f"removed {len(leftovers)} half-written artifact(s) left by an interrupted run")
        # Under the lock: which build each node names depends on what the store holds now.
        resolve_builds(
            plan.nodes,
            store.current_build,
            lambda node: store.next_build(node.default_id) if node.name in forced and store.exists(node.id) else None,
        )
        store.write_run(log)
        built: dict[str, Any] = {}
        try:

            def logged(node: Node, record: dict) -> None:
                log["nodes"].append(record)
                result.records.append(record)
                store.write_run(log)
                _update_latest(store, plan, node, run_id, built[node.name])

            for group in _batches(selected):
                if not group[0].side_by_side:
                    logged(group[0], _run_node(group[0], built, store, group[0].name in forced, nproc, run_id))
                    continue
                try:
                    done = _run_side_by_side(group, built, store, forced, nproc, run_id)
                except PartialBuild as exc:
                    for node, record in exc.done:
                        logged(node, record)
                    raise exc.error from None
                for node, record in done:
                    logged(node, record)
            log["status"] = "ok"
        except KeyboardInterrupt:
            log["status"] = "interrupted"
            result.ok, result.error = False, "interrupted"
            raise
        except PipelineError as exc:
            log["status"] = "failed"
            result.ok, result.error = False, str(exc)
            raise
        finally:
            log["finished"] = now_iso()
            log["total_s"] = round(time.monotonic() - started, 3)
            store.write_run(log)
    return result


def _forced(nodes: list[Node], selected: list[Node], force: list[str]) -> set[str]:
    """Forced nodes and everything downstream of them (their inputs' content changes)."""
    names = {n.name for n in selected}
    seeds = set()
    for item in force:
        hit = {n.name for n in nodes if n.name == item or n.stage == item or n.name.startswith(item + ".")}
        if not hit:
            raise UserInputError(f"--force {item}: no such stage in this recipe")
        seeds |= hit
    forced = set(seeds)
    for node in nodes:  # topological order
        if any(up in forced for up in node.inputs.values()):
            forced.add(node.name)
    return forced & names


def _batches(selected: list[Node]) -> list[list[Node]]:
    """The nodes in order, consecutive side-by-side nodes (see Node.side_by_side) together."""
    out: list[list[Node]] = []
    for node in selected:
        if out and node.side_by_side and out[-1][0].side_by_side == node.side_by_side:
            out[-1].append(node)
        else:
            out.append([node])
    return out


def _run_side_by_side(
    group: list[Node], built: dict, store: Store, forced: set[str], nproc: int, run_id: str
) -> list[tuple[Node, dict]]:
    """Build the group's nodes at the same time, each in its own process on its share of the
    cores. One that is cached is reused; one left to build alone still gets only its share, so
    that what it learns in its minutes does not depend on whether its partner was cached. With
    --nproc N each is a torchrun job that wants the whole machine: one after the other."""
    share = max(1, usable_cores() // len(group[0].side_by_side))
    records = {node.name: _record_head(node) for node in group}
    to_build = [node for node in group if node.name in forced or not _reuse(node, built, store, records[node.name])]
    if nproc > 1 or len(to_build) <= 1:  # (none: both were cached)
        for node in to_build:
            _build(node, records[node.name], built, store, nproc, run_id, cores=None if nproc > 1 else share)
        return [(node, records[node.name]) for node in group]

    console.print(
        f"[cyan]▶[/cyan] {' and '.join(n.name for n in to_build)} side by side, "
        f"{share} core{'s' if share > 1 else ''} each"
    )
    failures: list[PipelineError] = []
    with (
        _side_by_side_display([n.name for n in to_build]) as show,
        ThreadPoolExecutor(max_workers=len(to_build)) as pool,
    ):
        futures = {
            pool.submit(
                _build, node, records[node.name], built, store, nproc, run_id, cores=share, on_status=show(node.name)
            ): node
            for node in to_build
        }
        try:
            wait(futures)
        except KeyboardInterrupt:
            # A terminal's Ctrl-C reaches the workers too; a SIGINT sent to this process alone
            # does not. Either way wait for them: each build then removes its half-written output.
            for proc in interrupt_children():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
            wait(futures, timeout=120)
            raise
        for future in futures:
            try:
                future.result()
            except PipelineError as exc:
                failures.append(exc)
    done = [(node, records[node.name]) for node in group if records[node.name].get("action") in ("reused", "built")]
    if failures:
        raise PartialBuild(done, failures[0])
    return done


class PartialBuild(PipelineError):
    """A side-by-side build in which at least one node failed: `done` were committed all the same."""

    def __init__(self, done: list[tuple[Node, dict]], error: PipelineError):
        super().__init__(str(error))
        self.done, self.error = done, error


@contextlib.contextmanager
def _side_by_side_display(names: list[str]):
    """show(name) -> a callback for that build's progress lines: on a terminal one live line per
    build; in a log, every line as it comes."""
    if not console.is_terminal:
        yield lambda name: lambda text: console.print(f"  [dim]{name}:[/dim] {escape(text)}")
        return
    width = max(len(n) for n in names)
    with Progress(
        TextColumn("  {task.fields[label]}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        tasks = {name: progress.add_task("starting", label=name.ljust(width), total=None) for name in names}
        yield lambda name: lambda text: progress.update(tasks[name], description=escape(text))


def _record_head(node: Node) -> dict:
    record = {"node": node.name, "stage": node.stage, "id": node.id, "fingerprint": node.fingerprint}
    if node.build:
        record["rebuild_of"] = node.default_id
    return record


def _reuse(node: Node, built: dict, store: Store, record: dict) -> bool:
    """Reuse the node's artifact if the store has it and it verifies (True; it is then in `built`
    and the record says so). One that fails verification is quarantined, to be rebuilt."""
    if not store.exists(node.id):
        return False
    t0 = time.monotonic()
    problems = store.verify(node.id)
    if not problems:
        built[node.name] = store.get(node.id)
        record.update(action="reused", duration_s=round(time.monotonic() - t0, 3))
        console.print(f"[green]✓[/green] {node.name:<22} reused   {node.id}")
        return True
    console.print(f"[red]✗[/red] {node.name}: artifact {node.id} failed verification:")
    for line in problems[:10]:
        console.print(f"    {line}", markup=False)
    moved = store.quarantine_artifact(node.id)
    console.print(f"    moved to {moved}; rebuilding", markup=False)
    record["rebuilt_because"] = problems[:10]
    return False


def _run_node(node: Node, built: dict, store: Store, force: bool, nproc: int, run_id: str) -> dict:
    record = _record_head(node)
    if force or not _reuse(node, built, store, record):
        _build(node, record, built, store, nproc, run_id)
    return record


def _build(
    node: Node,
    record: dict,
    built: dict,
    store: Store,
    nproc: int,
    run_id: str,
    cores: int | None = None,
    on_status: Callable[[str], None] | None = None,
) -> None:
    t0 = time.monotonic()
    console.print(f"[cyan]▶[/cyan] {node.name:<22} building {node.id}")
    run_stage = node.spec.load()
    inputs = {role: built[up] for role, up in node.inputs.items()}
    work = store.work_dir(node.id)
    stage_started = now_iso()
    with store.writing(node.id) as out:
        ctx = StageContext(
            name=node.name,
            settings=node.settings,
            config=node.config,
            inputs=node.spec.inputs.of(inputs),
            out=out,
            work=work,
            nproc=nproc,
            cores=cores,
            on_status=on_status,
            recorded=node.recorded,
        )
        record["events"] = ctx.events
        try:
            metrics = run_stage(ctx) or {}
            if problems := node.spec.output.problems(metrics):  # the manifest keeps only declared keys
                raise StageFailed(f"its metrics: {problems[0]} (declared in {node.spec.declaration})")
        except PipelineError as exc:
            record.update(action="failed", error=str(exc), duration_s=round(time.monotonic() - t0, 3))
            failed = PipelineError(f"stage {node.name} failed: {exc}")
            failed.exit_code = exc.exit_code  # bad input (a data file, say) stays exit 2
            raise failed from exc
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:
            if full := no_room(exc):  # one line, not a traceback: nothing here is a bug
                record.update(action="failed", error=f"no room: {full}", duration_s=round(time.monotonic() - t0, 3))
                raise PipelineError(
                    f"stage {node.name} failed: no room to write ({full}); the store is unchanged and a "
                    "training's checkpoints are kept: free some space (e.g. `pipeline artifacts gc`) and run again"
                ) from exc
            record.update(
                action="failed",
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
                duration_s=round(time.monotonic() - t0, 3),
            )
            console.print_exception(max_frames=8)
            raise PipelineError(f"stage {node.name} crashed: {type(exc).__name__}: {exc}") from exc
        duration = round(time.monotonic() - t0, 3)
        choices_from = None
        if isinstance(metrics.get("choices"), dict):  # recorded for this id: the lock hands them back
            metrics["choices"] = {"for": node.default_id, **metrics["choices"]}
            choices_from = "lock" if metrics["choices"] == node.recorded else "measured"
        manifest = {
            "stage": node.name,
            "kind": node.stage,
            "fingerprint": node.fingerprint,
            "code_version": node.spec.version,
            "code": node.code,
            "config": node.config,
            "inputs": {role: built[up].id for role, up in node.inputs.items()},
            "metrics": metrics,
            "created": now_iso(),
            "started": stage_started,
            "duration_s": duration,
            "versions": tool_versions(),
        }
        if node.build:
            manifest["rebuild_of"] = node.default_id
        if choices_from:
            manifest["choices_from"] = choices_from
        artifact = store.commit(node.id, out, manifest)
        if node.build:
            store.record_build(node.default_id, node.id, run_id)
    store.drop_work_dir(node.id)
    built[node.name] = artifact
    record.update(action="built", duration_s=duration, metrics=_small(metrics))
    console.print(f"[green]✓[/green] {node.name:<22} built    {node.id} in {_fmt_s(duration)}")


def _update_latest(store: Store, plan: Plan, node: Node, run_id: str, artifact) -> None:
    """The store's pointer to what the recipe's latest run used, and the recipe's lock file."""
    pointer = store.latest(plan.name, plan.path) or {"recipe": plan.name, "nodes": {}}
    by_name = {n.name: n for n in plan.nodes}
    pointer.update(recipe_path=str(plan.path), run=run_id, updated=now_iso())
    pointer["nodes"][node.name] = {
        "id": node.id,
        "fingerprint": node.fingerprint,
        "stage": node.stage,
        "version": node.spec.version,
        "code": node.code,
        "config": node.config,
        "inputs": {role: by_name[up].input_key for role, up in node.inputs.items()},
        "input_ids": {role: by_name[up].id for role, up in node.inputs.items()},
        "content": content_digest(artifact.manifest),
    }
    choices = (artifact.manifest.get("metrics") or {}).get("choices")
    if isinstance(choices, dict):
        pointer["nodes"][node.name]["choices"] = choices
    store.set_latest(plan.name, pointer, plan.path)
    problem = write_lock(plan.path, [n.name for n in plan.nodes], pointer["nodes"])
    if problem and not plan.lock_warned:
        console.print(f"[yellow]{escape(problem)}[/yellow]")
        plan.lock_warned = True


def _small(metrics: dict) -> dict:
    """Scalars only, for the run log (the manifest keeps everything)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def summary_table(result: RunResult, total_s: float) -> Table:
    table = Table(title=f"run {result.run_id} ({_fmt_s(total_s)})", title_justify="left")
    for col in ("stage", "artifact", "action", "time", "key figures"):
        table.add_column(col)
    for rec in result.records:
        metrics = rec.get("metrics") or {}
        keys = [k for k in metrics if k in result.headline.get(rec["node"], ())][:4]
        figures = ", ".join(f"{k}={_fmt_value(metrics[k])}" for k in keys)
        table.add_row(rec["node"], rec["id"], rec["action"], _fmt_s(rec.get("duration_s", 0)), figures)
    return table


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
