"""Running a stage's work in other processes, from the same stage code.

The runner stays one process (it holds the store lock); a stage that can use several processes
writes its job to a JSON file and starts `torchrun -m <job module> JOB.json`. Each worker
calls the stage's job function with its rank; rank 0 writes the metrics the stage returns.
A stage built side by side with another (see the runner) starts one such worker of its own,
`python -m <stage module> JOB.json`, on its share of the cores: one process per training, so
that neither waits on the other's interpreter lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from rich.markup import escape

from .context import PROGRESS_EVERY_ENV, StageContext, console, progress_bar
from .errors import PipelineError
from .store import hold_work_dir

# Set in a worker's environment: the pid it must not outlive.
PARENT_ENV = "PIPELINE_PARENT_PID"


def _write_job(ctx: StageContext, job: dict) -> tuple[Path, Path]:
    job_path = ctx.work / "job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    metrics_path = ctx.work / "metrics.json"
    metrics_path.unlink(missing_ok=True)
    return job_path, metrics_path


def _read_metrics(metrics_path: Path, rc: int, what: str) -> dict:
    if rc != 0 or not metrics_path.is_file():
        if rc == 130:
            raise PipelineError(f"{what} was interrupted; its checkpoints are kept, run again to resume")
        raise PipelineError(f"{what} exited with code {rc}; its checkpoints are kept, run again to resume")
    return json.loads(metrics_path.read_text(encoding="utf-8"))


def launch(ctx: StageContext, module: str, job: dict) -> dict:
    import torch

    job_path, metrics_path = _write_job(ctx, job)
    env = dict(os.environ)
    if not torch.cuda.is_available():
        # The cores are shared out: N processes with all cores each would oversubscribe them.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ctx.nproc))
    env[PARENT_ENV] = str(os.getpid())
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ctx.nproc}",
        "-m",
        module,
        str(job_path),
    ]
    ctx.log(f"launching {ctx.nproc} processes: torchrun --nproc_per_node={ctx.nproc} -m {module}")
    # torchrun starts each worker in a session of its own, so neither a terminal's Ctrl-C nor a
    # signal to this process group reaches them: torchrun gets SIGTERM when this process dies
    # (parent-death signal) and stops them; each worker dies when torchrun does (worker_main).
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_parent_death_signal(signal.SIGTERM))
    try:
        rc = proc.wait()
    except BaseException:
        stop_tree(proc)
        raise
    return _read_metrics(metrics_path, rc, f"{ctx.nproc}-process run")


def _descendants(pid: int) -> list[int]:
    """Every live descendant of pid (Linux /proc), children first."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            with contextlib.suppress(OSError):
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                out += kids
                todo += kids
    return out


def stop_tree(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop a launcher and every process under it: SIGTERM to the launcher (torchrun passes it on
    to its workers and waits for them), then SIGKILL to whatever is left, workers included."""
    tree = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    for pid in [proc.pid, *tree, *_descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _parent_death_signal(sig: int):
    """A preexec_fn: the child gets `sig` when the thread that started it ends (Linux)."""

    def set_it() -> None:
        _prctl_pdeathsig(sig)

    return set_it if sys.platform.startswith("linux") else None


def _prctl_pdeathsig(sig: int) -> None:
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))


_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()


def launch_alone(ctx: StageContext, module: str, job: dict, threads: int) -> dict:
    """Run the job in one worker process with `threads` intra-op threads, relaying its output:
    its log lines become this stage's (and the run log's) events, its progress lines go to
    `ctx.status`. The worker dies with this process (a SIGKILLed runner leaves no orphan
    writing into a work folder that the next run resumes from)."""
    job_path, metrics_path = _write_job(ctx, job)
    # On a terminal its progress lines feed a live display: often. In a log: as often as ever.
    every = "2" if console.is_terminal else os.environ.get(PROGRESS_EVERY_ENV, "30")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        PARENT_ENV: str(os.getpid()),
        PROGRESS_EVERY_ENV: every,
        "COLUMNS": "400",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("WORLD_SIZE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(job_path)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    with _children_lock:
        _children.add(proc)
    log_prefix = f"  {_worker_name(job, job_path)}: "
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if line.startswith(log_prefix):
                ctx.log(line[len(log_prefix) :], markup=False)
            elif line.strip():
                ctx.status(line.strip())
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with _children_lock:
            _children.discard(proc)
    return _read_metrics(metrics_path, rc, "the training process")


def interrupt_children() -> list[subprocess.Popen]:
    """Pass a Ctrl-C on to the workers `launch_alone` started (a SIGINT sent to the runner's pid
    alone does not reach them); returns them, for the caller to wait on."""
    with _children_lock:
        children = list(_children)
    for proc in children:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    return children


def _worker_name(job: dict, job_path: Path) -> str:
    """The job's role (a training job's is its node's), else its work folder's name."""
    return job.get("role") or (job.get("node") or {}).get("role") or job_path.parent.name


def _die_with_parent() -> None:
    """A worker never outlives the run that started it. Linux: the kernel SIGKILLs this process
    when its parent ends (the runner, or under torchrun the torchrun agent, which itself gets
    SIGTERM when the runner ends). If the parent is gone already, end now; under torchrun a
    watchdog thread also ends this worker once the runner (its grandparent) is gone."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    if sys.platform.startswith("linux"):
        _prctl_pdeathsig(signal.SIGKILL)
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    if not under_torchrun:
        if os.getppid() != int(parent):
            os._exit(1)
        return
    launcher = os.getppid()
    if launcher == 1 or not _alive(int(parent)):
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != launcher or not _alive(int(parent)):
                os._exit(1)

    threading.Thread(target=watch, name="die-with-runner", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_main(job_fn: Callable[..., dict]) -> None:
    """Body of `python -m <stage module> JOB.json` under torchrun."""
    import torch
    import torch.distributed as dist

    _die_with_parent()
    job_path = Path(sys.argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    # Held for this process's life: no later run (nor gc) touches the work folder while it writes.
    hold_work_dir(job_path.parent, f"{_worker_name(job, job_path)} worker")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    distributed = "WORLD_SIZE" in os.environ  # under torchrun; else one worker on its own
    if distributed:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    name = _worker_name(job, job_path)
    log = (
        (lambda msg: console.print(f"  [dim]{escape(name)}:[/dim] {escape(msg)}")) if rank == 0 else (lambda msg: None)
    )
    progress = progress_bar if rank == 0 else silent_progress
    finished = False
    try:
        metrics = job_fn(job, log, progress, rank=rank, device=f"cuda:{local_rank}" if cuda else "cpu")
        if rank == 0:
            tmp = job_path.with_name("metrics.json.tmp")
            tmp.write_text(json.dumps(metrics), encoding="utf-8")
            os.replace(tmp, job_path.with_name("metrics.json"))
        finished = True
    except KeyboardInterrupt:
        # The runner that started this worker says what happened; its checkpoints are kept.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    finally:
        if distributed:
            if finished:
                # Every rank tears the group down together, as torch's docs ask: rank 0 still
                # averages checkpoints when the others return, and a CI run's rank 1 aborted
                # (SIGABRT, "terminate called without an active exception") while it did.
                dist.barrier()
            dist.destroy_process_group()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def silent_progress(*args, **kwargs):
    class _Bar:
        def advance(self, *a, **k):
            pass

    yield _Bar()
