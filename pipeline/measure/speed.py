"""Opening a model to time it, and what a measurement process knows of itself: its peak memory,
the GPU's, the runtime's versions. The measurements themselves: latency.py (one model's batch-1
latency and throughput) and versus.py (ours against CTranslate2), each run in a fresh process by
process.py, so that the thread count is set before any runtime starts its thread pool (torch's
cannot always be re-sized after first use) and the peak RSS is that of this model alone.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident memory. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    would carry over the parent's peak across fork + exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def gpu_used_mb() -> float | None:
    """Memory in use on GPU 0 (all processes), from nvidia-smi; None without one. The benchmark
    machine runs one measurement at a time, so the growth of this figure is this process's."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


class Skip(Exception):
    """This measurement cannot be made here (e.g. the runtime has no CUDA); the reason is the row's."""


def translator_for(job: dict):
    """A measurement job's translator, opened through the registry (pipeline.measure.translators.open_model)
    on the job's device with its thread count; Skip where its runtime cannot run on that device here."""
    runtime, device, threads = job["runtime"], job["device"], job["threads"]
    folder = Path(job["folder"]) / job["package"] if job.get("package") else Path(job["folder"])
    options = {}
    if runtime == "ctranslate2":
        import ctranslate2

        if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise Skip("ctranslate2 sees no CUDA device")
        options["compute_type"] = job["compute_type"]
    if runtime == "torch":
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} has no CUDA here")
    from pipeline.measure.translators import open_model

    translator = open_model(folder, device=device, threads=threads, **options)
    if translator.device != device:
        raise Skip(
            f"{translator.runtime}'s {device} execution provider did not load "
            f"(providers: {translator.describe().get('providers', '?')})"
        )
    return translator


def synchronizer(runtime: str, device: str):
    """A function that waits for the GPU (translate() already returns host data; this makes sure)."""
    if device == "cuda" and runtime == "torch":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def runtime_versions(runtime: str) -> dict:
    info: dict = {}
    if runtime == "torch":
        import torch

        info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_threads": torch.get_num_threads()}
    elif runtime == "onnxruntime":
        import onnxruntime

        info = {"onnxruntime": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}
    elif runtime == "ctranslate2":
        import ctranslate2

        info = {"ctranslate2": ctranslate2.__version__, "cuda_devices": ctranslate2.get_cuda_device_count()}
    elif runtime == "optimum":  # in its own environment (pipeline/measure/optimum_peer.py)
        from model.optimum_translator import versions

        info = versions()
    return info
