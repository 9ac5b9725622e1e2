"""A training's checkpoints: work/checkpoint/ (the latest, to resume from: model, optimizer, the
RNG states, the loop's state) and work/snapshots/ (epoch ends, for averaging), safetensors + JSON
written to a temporary name and renamed, so that a kill never leaves half of one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from mt_runtime.files import reason
from safetensors.torch import load_file, save_file

from model.transformer import Transformer

from ..engine.errors import PipelineError
from ..engine.store import file_record, listed_file_problems, write_json_atomic


class Checkpoints:
    """work/checkpoint/ (latest, for resuming) and work/snapshots/ (epoch ends, for averaging).
    Checked like artifacts: state.json, written last, lists the size and sha256 of the checkpoint's
    tensors, and each kept snapshot's entry its own; a resumed run checks them before loading, and
    a damaged checkpoint is one line naming the folder to remove."""

    def __init__(self, work: Path):
        self.dir = work / "checkpoint"
        self.snapshots = work / "snapshots"

    def exists(self) -> bool:
        return (self.dir / "state.json").is_file()

    def saved_state(self) -> dict | None:
        """The last checkpoint's state.json (no tensors), or None where there is none."""
        for folder in (self.dir, self.dir.with_name("checkpoint.old")):  # .old: killed between renames
            if (folder / "state.json").is_file():
                return self._read_state(folder)
        return None

    def save(self, model: Transformer, optimizer: torch.optim.Optimizer, state: dict) -> None:
        tmp = self.dir.with_name("checkpoint.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        opt_tensors, opt_meta = _flatten_optimizer(optimizer)
        opt_tensors["rng.torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # dropout's on a GPU
            opt_tensors["rng.cuda"] = torch.cuda.get_rng_state()
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        files = {}
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.name] = file_record(f)
        write_json_atomic(tmp / "state.json", {**state, "optimizer": opt_meta, "files": files})
        old = self.dir.with_name("checkpoint.old")
        if self.dir.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(self.dir, old)
        os.rename(tmp, self.dir)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, model: Transformer, optimizer: torch.optim.Optimizer) -> dict:
        if not self.exists() and self.dir.with_name("checkpoint.old").is_dir():
            os.rename(self.dir.with_name("checkpoint.old"), self.dir)  # killed between the two renames
        state = self._read_state(self.dir)
        try:
            model.load_state_dict(load_file(str(self.dir / "model.safetensors")))
            tensors = load_file(str(self.dir / "optimizer.safetensors"))
            torch.set_rng_state(tensors.pop("rng.torch"))
            cuda_rng = tensors.pop("rng.cuda", None)
            if cuda_rng is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state(cuda_rng)
            optimizer.load_state_dict(_unflatten_optimizer(tensors, state.pop("optimizer")))
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:  # safetensors' errors too
            raise self._damaged(self.dir, f"does not load ({reason(exc)})") from None
        state.pop("files", None)
        return state

    def _read_state(self, folder: Path) -> dict:
        """state.json of a checkpoint folder, once the files it lists and the snapshots it keeps
        match their sizes and digests."""
        try:
            state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise self._damaged(folder, f"state.json is unreadable ({reason(exc)})") from None
        if not isinstance(state, dict) or not isinstance(state.get("kept", []), list):
            raise self._damaged(folder, "state.json is not a checkpoint's state")
        problems = listed_file_problems(folder, state.get("files") or {}, record="state.json", folder="folder")
        for entry in state.get("kept", []):
            if isinstance(entry, dict) and isinstance(entry.get("snapshot"), dict):
                problems += self._snapshot_problems(entry)
        if problems:
            raise self._damaged(folder, problems[0])
        return state

    def _snapshot_problems(self, entry: dict) -> list[str]:
        name = f"{entry.get('name')}.safetensors"
        return listed_file_problems(self.snapshots, {name: entry["snapshot"]}, record="the checkpoint", folder="folder")

    def _damaged(self, folder: Path, problem: str) -> PipelineError:
        problem = problem.replace(f"{folder}/", "")  # the file's name once, after the folder's
        return PipelineError(
            f"{folder}: {problem}; this training cannot resume from it: remove {folder.parent} "
            "and run again to train from the start"
        )

    def save_snapshot(self, model: Transformer, name: str) -> dict:
        """Save an epoch end's weights; returns the file's record (size and sha256) for `kept`."""
        self.snapshots.mkdir(parents=True, exist_ok=True)
        tmp = self.snapshots / f"{name}.tmp"
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp))
        os.replace(tmp, self.snapshots / f"{name}.safetensors")
        return file_record(self.snapshots / f"{name}.safetensors")

    def load_snapshot(self, entry: dict) -> dict:
        """The weights of a kept snapshot, checked against its record where it has one."""
        problems = self._snapshot_problems(entry) if isinstance(entry.get("snapshot"), dict) else []
        if problems:
            raise self._damaged(self.snapshots, problems[0])
        return load_file(str(self.snapshots / f"{entry['name']}.safetensors"))

    def drop_unkept(self, kept: list[dict]) -> None:
        """Delete every snapshot the saved checkpoint does not name (and any half-written one).
        Called only once a checkpoint recording `kept` is on disk: a checkpoint never names a
        snapshot that is gone, whatever moment a kill lands at."""
        if not self.snapshots.is_dir():
            return
        names = {f"{entry['name']}.safetensors" for entry in kept}
        for path in self.snapshots.iterdir():
            if path.name not in names:
                path.unlink(missing_ok=True)


def _flatten_optimizer(optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, entry in sd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{key}"] = value.detach().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}
