"""Facts of what the benchmark measures, beside its timings: the bytes of a model's weights, its
parameters and heads, and the machine (CPU, cores, GPU, library versions)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from ..engine.machine import usable_cores
from ..engine.store import Artifact, tool_versions


def model_bytes(folder: Path) -> int:
    """Bytes of the weights a runtime loads: safetensors, ONNX graphs and their external data,
    CTranslate2's model.bin. Tokenizer and small JSON files are not counted."""
    folders = [folder] + ([folder / "checkpoint"] if (folder / "checkpoint").is_dir() else [])  # an imported teacher
    weights = [
        p
        for f in folders
        for p in f.iterdir()
        if p.is_file()
        and (
            p.name in ("model.safetensors", "model.bin", "pytorch_model.bin")
            or p.suffix in (".onnx", ".data")
            or p.name.endswith("_data")
        )
    ]
    return sum(p.stat().st_size for p in weights)


def model_facts(artifact: Artifact) -> tuple[int | None, int | None]:
    """(parameters, attention heads in total) of a PyTorch model artifact: its metrics, else its files."""
    metrics = artifact.metrics
    if metrics.get("params") is not None and (metrics.get("heads") is not None or metrics.get("imported")):
        return metrics["params"], metrics.get("heads")
    config = json.loads((artifact.path / "config.json").read_text(encoding="utf-8"))
    heads = sum(config["enc_heads"]) + sum(config["dec_self_heads"]) + sum(config["dec_cross_heads"])
    from safetensors import safe_open

    params = 0
    with safe_open(str(artifact.path / "model.safetensors"), "np") as f:
        for key in f.keys():
            size = 1
            for dim in f.get_slice(key).get_shape():
                size *= dim
            params += size
    return params, heads


def describe_machine(machine: dict) -> dict:
    """What a reader needs to interpret the numbers: CPU, cores, GPU, library versions."""
    info = {
        "cpu": machine.get("cpu"),
        "isa": machine.get("isa"),
        "cores": machine.get("cores") or os.cpu_count() or 1,
        "gpu": machine.get("gpu"),
        "system": machine.get("system"),
        "versions": tool_versions(),
        "runtimes": {},
    }
    info["usable_cores"] = usable_cores()  # what "all" threads means here
    if info["gpu"] and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            driver, memory = (x.strip() for x in out.split(",", 1))
            info.update(gpu_driver=driver, gpu_memory=memory)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return info
