"""What machine the numbers come from: CPU model, cores, GPU (found without importing torch)."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess


@functools.lru_cache(maxsize=1)
def machine_info() -> dict:
    return {"cpu": _cpu_model(), "cores": os.cpu_count() or 1, "gpu": _gpu_name(),
            "system": f"{platform.system()} {platform.machine()}"}


def usable_cores() -> int:
    """The cores this process may run on (a container or taskset can allow fewer than the host has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    """The first CUDA GPU's name, or None. nvidia-smi answers in milliseconds; torch would take seconds."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None
