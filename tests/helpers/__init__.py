"""What tests share that is not a fixture (fixtures live in the conftest.py of the folder that
uses them): paths, the `pipeline` command in a subprocess, small real models and their inputs, the
smoke recipe's store, peak memory of a child process, and the one-error-line checks."""

from __future__ import annotations

import contextlib
import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


SMOKE = REPO / "recipes" / "smoke.yaml"


# A subprocess's PYTHONPATH: this checkout's pipeline and its mt_runtime (not an installed copy's).
SOURCE_PATH = f"{REPO}:{REPO / 'model' / 'runtime'}"


def _data_dir() -> Path:
    env = os.environ.get("PIPELINE_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    if not (path / "multi30k" / "train.en.gz").is_file():
        pytest.exit(f"Multi30k not found under {path}: set PIPELINE_DATA to the folder holding multi30k/", 2)
    return path


class QuietContext:
    """The part of a StageContext that the benchmark's comparison functions use, silent; `work`
    is where their measurement processes keep their job files."""

    log = staticmethod(lambda message: None)

    def __init__(self, work: Path | None = None):
        self.work = work

    @staticmethod
    def progress(*args, **kwargs):
        return contextlib.nullcontext(type("Bar", (), {"advance": lambda self, n=1: None})())


def multi30k_head(data_dir: Path, lang: str, n: int = 300) -> list[str]:
    """The first n training sentences of one language of the Multi30k copy."""
    with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def pruned_shape_config(vocab_size: int):
    """A tiny Transformer with a pruned model's less common paths: uneven heads and FFN widths per
    layer, a factorised token table, pre-LN."""
    from model.transformer import TransformerConfig

    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=48,
        head_dim=8,
        enc_heads=[6, 3],
        dec_self_heads=[2, 6],
        dec_cross_heads=[6, 1],
        enc_ffn=[96, 64],
        dec_ffn=[64, 96],
        embed_dim=32,
        pre_ln=True,
        max_positions=64,
        dropout=0.0,
    )


def one_layer_config(vocab_size: int, head_dim: int = 4, **rest):
    """The smallest model the tests train or export: one layer each side, d_model 16, 2 heads;
    `rest` sets the other fields (max_positions, dropout, ...)."""
    from model.transformer import TransformerConfig

    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=16,
        head_dim=head_dim,
        enc_heads=[2],
        dec_self_heads=[2],
        dec_cross_heads=[2],
        enc_ffn=[32],
        dec_ffn=[32],
        **rest,
    )


def tiny_model(data_dir: Path, folder: Path):
    """A tiny random Transformer with a pruned model's less common paths (uneven heads, a
    factorised table, pre-LN), sharper than its init so that outputs end before their limits as
    trained ones do, with folder/tokenizer.json and folder/shortlist.npz made from the first 200
    Multi30k pairs: (model, tokenizer, the 200 English sentences, the pairs as token ids)."""
    import torch
    from mt_runtime.shortlist import build_shortlist

    from model.subword_training import train_subword
    from model.transformer import Transformer

    en, fr = multi30k_head(data_dir, "en", 200), multi30k_head(data_dir, "fr", 200)
    tokenizer = train_subword(en + fr, vocab_size=300)
    tokenizer.save(folder / "tokenizer.json")
    pairs = list(zip(tokenizer.encode(en), tokenizer.encode(fr)))
    table, _ = build_shortlist(pairs, tokenizer.vocab_size, frequent=30, per_word=6, always=[0, 1, 2, 3])
    table.save(folder / "shortlist.npz")
    torch.manual_seed(3)
    model = Transformer(pruned_shape_config(tokenizer.vocab_size)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.6)
    return model, tokenizer, en, pairs


# Counts the fault and fuzz tests report (kills survived, inputs tried), printed after the run
# even under -q, where a test's own output is captured.
SUMMARY: dict[str, int] = {}


def count(name: str, amount: int = 1) -> None:
    SUMMARY[name] = SUMMARY.get(name, 0) + amount


def cli(
    *args: str,
    store: Path | None = None,
    input: bytes | None = None,
    timeout: float = 300,
    env: dict | None = None,
    code: Path = REPO,
) -> subprocess.CompletedProcess:
    """Run the real `pipeline` command in a subprocess, from the source tree `code`."""
    cmd = [sys.executable, "-m", "pipeline.commands.cli", *args]
    if store is not None:
        cmd += ["--store", str(store)]
    full_env = {**os.environ, "PYTHONPATH": f"{code}:{code / 'model' / 'runtime'}", "COLUMNS": "200", **(env or {})}
    return subprocess.run(cmd, cwd=code, input=input, capture_output=True, timeout=timeout, env=full_env)


# Runs a module or script with a hook that reports its peak resident memory (VmHWM) at exit.
# Not wait4's ru_maxrss: a child forked from this test process starts its count at the
# parent's size (the kernel keeps the high-water mark across exec), which would hide the child.
_PEAK_SHIM = """
import atexit, runpy, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    sys.stderr.write(f"\\nPEAK_RSS_KB {kb}\\n")
atexit.register(_peak)
sys.argv = sys.argv[1:]
if sys.argv[0].endswith(".py"):
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_with_peak_rss(
    target: str, *args: str, env: dict | None = None, timeout: float = 600, input: bytes | None = None
) -> tuple[int, float, str, str]:
    """Run a module (`pipeline.commands.cli`) or a script path in a fresh process, `input` on its
    stdin: (exit code, its peak RSS in MB, stdout, stderr without the report line)."""
    full_env = {**os.environ, "PYTHONPATH": SOURCE_PATH, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SHIM, target, *args],
        capture_output=True,
        env=full_env,
        cwd=REPO,
        timeout=timeout,
        input=input,
    )
    err = done.stderr.decode(errors="replace")
    peaks = [line for line in err.splitlines() if line.startswith("PEAK_RSS_KB ")]
    peak = int(peaks[-1].split()[1]) / 1024 if peaks else float("nan")
    return done.returncode, peak, done.stdout.decode(errors="replace"), err.replace(peaks[-1], "") if peaks else err


class SmokeStore:
    """One store per test session, built stage by stage as tests ask for them."""

    def __init__(self, root: Path):
        self.root = root

    def build(self, until: str | None = None, *overrides: str):
        from pipeline.commands import plan_recipe
        from pipeline.engine.runner import run
        from pipeline.engine.store import Store

        plan = plan_recipe(SMOKE, [*overrides])
        store = Store(self.root)
        run(plan, store, until=until)
        return store, {n.name: store.get(n.id) for n in plan.nodes if store.exists(n.id)}


# A command's one error line, three ways the suite checks it (the first two as the hardening
# rounds wrote them; tests/helpers/files.py holds the third).
def _one_error(proc, code: int = 2) -> str:
    """The one error line of a command that failed (a run prints its progress too, no traceback)."""
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    return lines[0]


def _one_error_line(proc, code: int | None = None) -> str:
    err = proc.stderr.decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode in ((code,) if code else (1, 2)), err
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return err
