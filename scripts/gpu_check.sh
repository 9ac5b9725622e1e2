#!/usr/bin/env bash
# Reproduce the report's GPU rows: on a CUDA machine, run a recipe through its benchmark and
# report stages, print the table, and copy report.md / report.json / bleu_vs_latency.png to a folder.
#
#   scripts/gpu_check.sh [RECIPE] [--set key=value ...]
#
# RECIPE defaults to recipes/smoke.yaml (a few minutes from scratch, numbers meaningless for
# quality); give recipes/distill_int8.yaml for the real table (it trains every model first,
# unless the store already holds them). Environment: PYTHON (default python3), PIPELINE_ARTIFACTS
# (the store, default ./artifacts), GPU_REPORT_DIR (default ./gpu_report), PIPELINE_DATA.
# Without a CUDA GPU it says so and exits 0: there is nothing to check on such a machine.
# With one, it exits 1 if no GPU row could be measured (each skipped row says why).
set -euo pipefail
cd "$(dirname "$0")/.."

recipe="${1:-recipes/smoke.yaml}"
[[ $# -gt 0 ]] && shift
python="${PYTHON:-python3}"
store="${PIPELINE_ARTIFACTS:-artifacts}"
out="${GPU_REPORT_DIR:-gpu_report}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU on this machine (nvidia-smi finds none); skipped"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$python" -c "import torch; print('torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())"

"$python" -m pipeline run "$recipe" "$@" --store "$store"
"$python" -m pipeline report "$recipe" --store "$store"

mkdir -p "$out"
"$python" -m pipeline report "$recipe" --json --store "$store" > "$out/report.json"
"$python" - "$out" <<'EOF'
import json, shutil, sys
from pathlib import Path

out = Path(sys.argv[1])
report = json.loads((out / "report.json").read_text())
for name in ("report.md", "bleu_vs_latency.png"):
    shutil.copyfile(report["files"][name], out / name)
gpu = [r for r in report["rows"] if r["device"] == "cuda"]
measured = [r for r in gpu if not r["skipped"]]
print(f"gpu_check: {len(measured)} of {len(gpu)} GPU rows measured (run {report['run']}); files in {out}/")
for r in gpu:
    if r["skipped"]:
        print(f"  {r['name']}: skipped: {r['skipped']}")
sys.exit(0 if measured else 1)
EOF
