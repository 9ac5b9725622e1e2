"""Optimum, the peer a Hugging Face user would pick, measured beside ours and CTranslate2 on an
imported teacher: Optimum's own export and int8 quantization, ORTModelForSeq2SeqLM's generate
(model/optimum_translator.py).

Optimum lives in an environment of its own (optimum-onnx 0.1.0 requires transformers<4.58; this
project's allows transformers 5), made by scripts/optimum_env.sh at .venv-optimum/ in the
repository root, or wherever $OPTIMUM_VENV says. Nothing here imports optimum: the export and the
measurement processes run with that environment's interpreter, the measurement the same
`python -m pipeline.measure.process` as every row's. Without the environment the rows are
skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-optimum"
SCRIPT = "scripts/optimum_env.sh"
RUNTIME = "optimum"
COMPUTE_TYPES = ("int8", "float32")  # model/optimum_translator.py's
EXPORT_TIMEOUT_S = 900


class OptimumFailed(RuntimeError):
    """Optimum's export or quantization failed; the message is the row's reason."""


def venv() -> Path:
    return Path(os.environ.get("OPTIMUM_VENV") or DEFAULT_VENV)


def python() -> Path:
    return venv() / "bin" / "python"


def env_versions() -> str | None:
    """The Optimum environment's releases ("optimum==2.1.0 optimum-onnx==0.1.0 ..."), or None
    where there is none (no interpreter, or one without optimum-onnx): part of the benchmark's
    fingerprint, so that making the environment measures the rows it skipped."""
    exe = python()
    if not exe.is_file():
        return None
    code = (
        "import importlib.metadata as m\n"
        "print(' '.join(f'{p}=={m.version(p)}' for p in "
        "('optimum', 'optimum-onnx', 'transformers', 'onnxruntime', 'torch')))"
    )
    try:
        out = subprocess.run([str(exe), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def missing(versions: str | None) -> str | None:
    """Why the Optimum rows cannot be measured here (None: they can)."""
    if versions:
        return None
    where = f"$OPTIMUM_VENV ({venv()})" if os.environ.get("OPTIMUM_VENV") else f"{DEFAULT_VENV.name}/"
    return f"no Optimum environment at {where}: run {SCRIPT} (Optimum pins transformers<4.58, so it has its own)"


def process_env() -> dict[str, str]:
    """What a process of the Optimum environment needs to run this repository's code: the
    repository and mt-runtime (model/runtime, installed in the project's environment, not there)."""
    paths = [str(REPO), str(REPO / "model" / "runtime"), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def export(checkpoint: Path, dest: Path, compute_type: str) -> dict:
    """`checkpoint` exported (and for int8 quantized) by Optimum into `dest`, in the Optimum
    environment: the facts model/optimum_translator.export returns. OptimumFailed on failure."""
    try:
        out = subprocess.run(
            [str(python()), "-m", "model.optimum_translator", "export", str(checkpoint), str(dest), compute_type],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**process_env(), "OMP_NUM_THREADS": "1"},
            stdin=subprocess.DEVNULL,
            timeout=EXPORT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise OptimumFailed(f"Optimum's export took over {EXPORT_TIMEOUT_S} s and was stopped") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
        raise OptimumFailed(
            f"Optimum's export failed (exit {out.returncode}): {errors[-1][:300] if errors else 'no output'}"
        )
    return json.loads(lines[-1])


def note(facts: dict) -> str:
    """The row's note: how Optimum made and runs this model, in figures."""
    runs = facts.get("session_runs", {})
    q = facts.get("quantization")
    made = (
        f"Optimum's ORTQuantizer, dynamic int8, preset {q['preset']} (weights {q['weights']}, per channel)"
        if q
        else "float32"
    )
    return (
        f"Optimum's export ({facts['export_bytes'] / 1e6:.1f} MB written for {facts['checkpoint_bytes'] / 1e6:.1f} MB "
        f"of weights: an encoder and three decoders; the encoder and the merged decoder kept, as "
        f"ORTModelForSeq2SeqLM loads), {made}; generate's search in Python, "
        f"{runs.get('beam1', {}).get('calls_per_sentence', '?')} onnxruntime calls a sentence greedy for "
        f"{runs.get('beam1', {}).get('tokens_per_sentence', '?')} tokens; "
        + " ".join(f"{k}=={v}" for k, v in facts["versions"].items())
    )
