"""What machine the numbers come from: CPU model and instruction level, cores, GPU (found
without importing torch)."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess


@functools.lru_cache(maxsize=1)
def machine_info() -> dict:
    return {
        "cpu": _cpu_model(),
        "isa": cpu_isa(),
        "cores": os.cpu_count() or 1,
        "gpu": _gpu_name(),
        "system": f"{platform.system()} {platform.machine()}",
    }


# The instruction levels that decide which kernels run (slowest first). On AVX2 alone, bf16
# arithmetic is emulated (tens of times slower than float32); AVX512-BF16 and AMX have it natively.
ISA_LEVELS = ("SSE", "AVX", "AVX2", "AVX-512", "AVX512-BF16", "AMX")
_FLAG_LEVELS = (
    ("amx_bf16", "AMX"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512f", "AVX-512"),
    ("avx2", "AVX2"),
    ("avx", "AVX"),
)
# The caps a user can set for torch's kernels (oneDNN's and ATen's dispatch), as the level they allow.
_ONEDNN_CAPS = {
    "SSE41": "SSE",
    "AVX": "AVX",
    "AVX2": "AVX2",
    "AVX2_VNNI": "AVX2",
    "AVX2_VNNI_2": "AVX2",
    "AVX512_CORE": "AVX-512",
    "AVX512_CORE_VNNI": "AVX-512",
    "AVX512_CORE_BF16": "AVX512-BF16",
    "AVX512_CORE_FP16": "AVX512-BF16",
    "AVX512_CORE_AMX": "AMX",
    "AVX512_CORE_AMX_FP16": "AMX",
}
_ATEN_CAPS = {"default": "SSE", "avx2": "AVX2", "avx512": "AVX-512"}


def cpu_isa() -> str:
    """The CPU's instruction level as torch may use it: the highest level its flags show, lowered
    by ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY where set ("AVX512-BF16, capped to AVX2")."""
    flags = _cpu_flags()
    native = next((level for flag, level in _FLAG_LEVELS if flag in flags), "SSE" if flags else "unknown")
    if native == "unknown":
        return native
    caps = [
        cap
        for cap in (
            _ONEDNN_CAPS.get(os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()),
            _ATEN_CAPS.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower()),
        )
        if cap
    ]
    effective = min([native, *caps], key=ISA_LEVELS.index)
    return native if effective == native else f"{native}, capped to {effective}"


def effective_isa(isa: str) -> str:
    """The level kernels run at, from a cpu_isa() string."""
    return isa.rsplit("capped to ", 1)[-1]


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


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
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None
