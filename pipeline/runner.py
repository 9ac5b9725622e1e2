"""Plan and execute a recipe: reuse every artifact whose fingerprint exists and verifies,
build the rest in dependency order, and log what happened."""

from __future__ import annotations

import os
import secrets
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from . import stages
from .context import StageContext, console
from .errors import PipelineError, UserInputError
from .graph import Node, build_graph, resolve_builds, select
from .machine import machine_info
from .recipe import Recipe, load_recipe
from .store import Store, now_iso, safe_name, tool_versions


@dataclass
class Plan:
    recipe: Recipe
    raw: dict
    path: Path
    overrides: list[str]
    nodes: list[Node]  # every node of the recipe
    machine: dict

    @property
    def name(self) -> str:
        return self.recipe.name


def make_plan(recipe_path: str | Path, overrides: list[str] = ()) -> Plan:
    recipe, raw = load_recipe(recipe_path, list(overrides))
    machine = machine_info() if _needs_machine(recipe) else None
    nodes = build_graph(recipe, recipe_path, machine)
    return Plan(recipe, raw, Path(recipe_path), list(overrides), nodes, machine)


def _needs_machine(recipe: Recipe) -> bool:
    return recipe.benchmark is not None or (recipe.export is not None and recipe.export.fp16)


# ------------------------------------------------------------------------------ status
def node_status(store: Store, plan: Plan) -> list[dict]:
    """Per node: cached / stale / missing, with the reason."""
    previous = (store.latest(plan.name) or {}).get("nodes", {})
    resolve_builds(plan.nodes, store.current_build)
    by_name = {n.name: n for n in plan.nodes}
    rows = []
    for node in plan.nodes:
        if store.exists(node.id):
            rows.append({"node": node.name, "state": "cached", "id": node.id, "reason": ""})
            continue
        before = previous.get(node.name)
        if before is None:
            rows.append({"node": node.name, "state": "missing", "id": node.id, "reason": "never built"})
            continue
        rows.append({"node": node.name, "state": "stale", "id": node.id,
                     "reason": _why_changed(node, before, by_name)})
    return rows


def _why_changed(node: Node, before: dict, by_name: dict[str, Node]) -> str:
    changed = _diff_keys(before.get("config"), node.config)
    if changed:
        shown = ", ".join(changed[:4]) + (f" (+{len(changed) - 4} more)" if len(changed) > 4 else "")
        return f"config changed: {shown}"
    old_inputs = before.get("inputs", {})
    moved = [role for role, up in node.inputs.items() if old_inputs.get(role) != by_name[up].input_key]
    if moved:
        return "input changed: " + ", ".join(f"{r} ({node.inputs[r]})" for r in moved)
    if before.get("version") != stages.STAGES[node.stage].version:
        return "stage code version changed"
    return "artifact missing from the store"


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
    ok: bool = True
    error: str | None = None


def run(plan: Plan, store: Store, until: str | None = None, force: list[str] = (), wait: bool = False,
        nproc: int = 1) -> RunResult:
    selected = select(plan.nodes, until)
    forced = _forced(plan.nodes, selected, force)
    run_id = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{safe_name(plan.name)}-{secrets.token_hex(2)}"
    log = {"run": run_id, "recipe": plan.name, "recipe_path": str(plan.path), "overrides": plan.overrides,
           "recipe_resolved": plan.raw, "until": until, "force": list(force), "nproc": nproc,
           "started": now_iso(), "machine": plan.machine, "pid": os.getpid(), "nodes": [],
           "status": "running"}
    result = RunResult(run_id)
    started = time.monotonic()

    def on_wait(holder):
        console.print(f"[yellow]waiting for the store lock held by pid {holder.get('pid', '?')} "
                      f"({holder.get('command', '?')})[/yellow]")

    def on_stale(holder):
        console.print(f"[yellow]took over a stale store lock left by pid {holder.get('pid')} "
                      f"(that process is gone)[/yellow]")

    with store.lock(wait=wait, on_wait=on_wait, on_stale=on_stale):
        leftovers = store.clean_tmp()
        if leftovers:
            console.print(f"removed {len(leftovers)} half-written artifact(s) left by an interrupted run")
        # Under the lock: which build each node names depends on what the store holds now.
        resolve_builds(plan.nodes, store.current_build,
                       lambda node: store.next_build(node.default_id)
                       if node.name in forced and store.exists(node.id) else None)
        store.write_run(log)
        by_name: dict[str, Node] = {n.name: n for n in plan.nodes}
        built: dict[str, Any] = {}
        try:
            for node in selected:
                record = _run_node(node, by_name, built, store, node.name in forced, nproc, run_id)
                log["nodes"].append(record)
                result.records.append(record)
                store.write_run(log)
                _update_latest(store, plan, node, run_id)
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


def _run_node(node: Node, by_name: dict[str, Node], built: dict, store: Store, force: bool,
              nproc: int, run_id: str) -> dict:
    record = {"node": node.name, "stage": node.stage, "id": node.id, "fingerprint": node.fingerprint}
    if node.build:
        record["rebuild_of"] = node.default_id
    t0 = time.monotonic()
    if store.exists(node.id) and not force:
        problems = store.verify(node.id)
        if not problems:
            artifact = store.get(node.id)
            built[node.name] = artifact
            record.update(action="reused", duration_s=round(time.monotonic() - t0, 3))
            console.print(f"[green]✓[/green] {node.name:<22} reused   {node.id}")
            return record
        console.print(f"[red]✗[/red] {node.name}: artifact {node.id} failed verification:")
        for line in problems[:10]:
            console.print(f"    {line}", markup=False)
        moved = store.quarantine_artifact(node.id)
        console.print(f"    moved to {moved}; rebuilding")
        record["rebuilt_because"] = problems[:10]

    console.print(f"[cyan]▶[/cyan] {node.name:<22} building {node.id}")
    run_stage = stages.load(node.stage)
    inputs = {role: built[up] for role, up in node.inputs.items()}
    work = store.work_dir(node.id)
    stage_started = now_iso()
    with store.writing(node.id) as out:
        ctx = StageContext(name=node.name, settings=node.settings, config=node.config, inputs=inputs,
                           out=out, work=work, nproc=nproc)
        record["events"] = ctx.events
        try:
            metrics = run_stage(ctx) or {}
        except PipelineError as exc:
            record.update(action="failed", error=str(exc), duration_s=round(time.monotonic() - t0, 3))
            raise PipelineError(f"stage {node.name} failed: {exc}") from exc
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:
            record.update(action="failed", error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(), duration_s=round(time.monotonic() - t0, 3))
            console.print_exception(max_frames=8)
            raise PipelineError(f"stage {node.name} crashed: {type(exc).__name__}: {exc}") from exc
        duration = round(time.monotonic() - t0, 3)
        manifest = {
            "stage": node.name, "kind": node.stage, "fingerprint": node.fingerprint,
            "code_version": stages.STAGES[node.stage].version, "config": node.config,
            "inputs": {role: built[up].id for role, up in node.inputs.items()},
            "metrics": metrics, "created": now_iso(), "started": stage_started,
            "duration_s": duration, "versions": tool_versions(),
        }
        if node.build:
            manifest["rebuild_of"] = node.default_id
        artifact = store.commit(node.id, out, manifest)
        if node.build:
            store.record_build(node.default_id, node.id, run_id)
    store.drop_work_dir(node.id)
    built[node.name] = artifact
    record.update(action="built", duration_s=duration, metrics=_small(metrics))
    console.print(f"[green]✓[/green] {node.name:<22} built    {node.id} in {_fmt_s(duration)}")
    return record


def _update_latest(store: Store, plan: Plan, node: Node, run_id: str) -> None:
    pointer = store.latest(plan.name) or {"recipe": plan.name, "nodes": {}}
    by_name = {n.name: n for n in plan.nodes}
    pointer.update(recipe_path=str(plan.path), run=run_id, updated=now_iso())
    pointer["nodes"][node.name] = {
        "id": node.id, "fingerprint": node.fingerprint, "stage": node.stage,
        "version": stages.STAGES[node.stage].version, "config": node.config,
        "inputs": {role: by_name[up].input_key for role, up in node.inputs.items()},
    }
    store.set_latest(plan.name, pointer)


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
        keys = [k for k in metrics if k in _HEADLINE][:4]
        figures = ", ".join(f"{k}={_fmt_value(metrics[k])}" for k in keys)
        table.add_row(rec["node"], rec["id"], rec["action"], _fmt_s(rec.get("duration_s", 0)), figures)
    return table


_HEADLINE = ("train_pairs", "vocab_size", "params", "bleu", "chrf", "best_valid_loss", "valid_bleu",
             "sentences", "heads_removed", "parity_max_abs_diff", "bytes_ratio", "rows")


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
