"""Running a stage's work in several processes with torchrun, from the same stage code.

The runner stays one process (it holds the store lock); a stage that can use several processes
writes its job to a JSON file and starts `torchrun -m <stage module> JOB.json`. Each worker
calls the stage's job function with its rank; rank 0 writes the metrics the stage returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from .context import StageContext, console, progress_bar
from .errors import PipelineError


def launch(ctx: StageContext, module: str, job: dict) -> dict:
    import torch

    job_path = ctx.work / "job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    metrics_path = ctx.work / "metrics.json"
    metrics_path.unlink(missing_ok=True)
    env = dict(os.environ)
    if not torch.cuda.is_available():
        # The cores are shared out: N processes with all cores each would oversubscribe them.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ctx.nproc))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ctx.nproc}",
           "-m", module, str(job_path)]
    ctx.log(f"launching {ctx.nproc} processes: torchrun --nproc_per_node={ctx.nproc} -m {module}")
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0 or not metrics_path.is_file():
        raise PipelineError(f"{ctx.nproc}-process run exited with code {rc}; its checkpoints are kept, "
                            "run again to resume")
    return json.loads(metrics_path.read_text(encoding="utf-8"))


def worker_main(job_fn: Callable[..., dict]) -> None:
    """Body of `python -m <stage module> JOB.json` under torchrun."""
    import torch
    import torch.distributed as dist

    job_path = Path(sys.argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    name = job.get("role") or job_path.parent.name
    log = (lambda msg: console.print(f"  [dim]{name}:[/dim] {msg}")) if rank == 0 else (lambda msg: None)
    progress = progress_bar if rank == 0 else silent_progress
    try:
        metrics = job_fn(job, log, progress, rank=rank, device=f"cuda:{local_rank}" if cuda else "cpu")
        if rank == 0:
            tmp = job_path.with_name("metrics.json.tmp")
            tmp.write_text(json.dumps(metrics), encoding="utf-8")
            os.replace(tmp, job_path.with_name("metrics.json"))
    finally:
        dist.destroy_process_group()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def silent_progress(*args, **kwargs):
    class _Bar:
        def advance(self, *a, **k):
            pass

    yield _Bar()
