"""One measurement in a fresh process: the benchmark stage runs `python -m pipeline.measure.process
JOB.json` once per measurement (run_process), the job a typed one (jobs.py), so that every
measurement starts from a fresh process: the thread count is set before any runtime starts its
thread pool, and the peak RSS is that of this model alone. The process writes RESULT.json (the
job file's "result" path) and exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import optimum_peer
from .cores import measure_cores
from .jobs import AloneJob, CoresJob, Job, VersusJob, from_json, to_json
from .latency import measure
from .speed import Skip
from .versus import measure_alone, measure_versus

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800  # one measurement slower than this is a result that says so, not a hung run


def run_process(
    jobs: Path, tag: str, job: Job, threads: int, timeout_s: float = TIMEOUT_S, python: Path | None = None
) -> dict:
    """`job` measured by this module in a fresh process (`python -m pipeline.measure.process`, its
    job, result and log files in `jobs`, named by `tag`) with `threads` for the math libraries.
    A process that fails or runs past `timeout_s` gives a result skipped with the reason. `python`:
    another environment's interpreter (the Optimum peer's: pipeline/measure/optimum_peer.py)."""
    jobs.mkdir(parents=True, exist_ok=True)
    result_path, log_path = jobs / f"{tag}.result.json", jobs / f"{tag}.log"
    result_path.unlink(missing_ok=True)
    (jobs / f"{tag}.json").write_text(json.dumps({**to_json(job), "result": str(result_path)}), encoding="utf-8")
    env = {
        **(optimum_peer.process_env() if python else os.environ),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    if not python:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            rc = subprocess.run(
                [str(python or sys.executable), "-m", "pipeline.measure.process", str(jobs / f"{tag}.json")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            return {
                "threads": threads,
                "skipped": f"measurement took over {timeout_s:g} s and was stopped "
                "(an oversubscribed machine makes multi-thread runs crawl)",
            }
    if rc == 0 and result_path.is_file():
        return json.loads(result_path.read_text(encoding="utf-8"))
    lines = [ln for ln in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    return {
        "threads": threads,
        "skipped": f"measurement process failed (exit {rc}): {lines[-1][:300] if lines else 'no output'}",
    }


def run(job: Job) -> dict:
    """The job measured in this process; a model that cannot be measured here gives a skipped result."""
    try:
        if isinstance(job, VersusJob):
            return measure_versus(job)
        if isinstance(job, AloneJob):
            return measure_alone(job)
        if isinstance(job, CoresJob):
            return measure_cores(job)
        return measure(job)
    except Skip as exc:
        return {"threads": job.threads, "skipped": str(exc)}


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    out = Path(data.pop("result"))
    result = run(from_json(data))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
