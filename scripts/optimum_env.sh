#!/usr/bin/env bash
# Makes the environment of the Optimum peer (pipeline/measure/optimum_peer.py): a venv of its own,
# because optimum-onnx 0.1.0 (Optimum's ONNX export and ORTModelForSeq2SeqLM) requires
# transformers<4.58 and this project's environment allows transformers 5. The benchmark finds it at
# .venv-optimum/ in the repository root (git-ignored), or at $OPTIMUM_VENV; without it the
# report's Optimum rows are skipped with the reason.
#
#   scripts/optimum_env.sh            # creates or refreshes .venv-optimum/
#   OPTIMUM_VENV=/elsewhere scripts/optimum_env.sh
#
# Pinned, so that its figures can be reproduced: the releases docs/results.md was measured with.
# onnxruntime is the release the project's own runtime was measured with, so that a row against
# ours compares the export and the search, not two onnxruntime builds. torch (for the export
# alone) is the release the project is tested with; the +cpu build where one lies on the machine.
# sentencepiece: Marian's tokenizers; sacrebleu: the measurement process scores the test set there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${OPTIMUM_VENV:-$root/.venv-optimum}
python=${PYTHON:-python3}

"$python" -m venv "$venv"
nice -n 19 "$venv/bin/pip" install --quiet \
    "optimum[onnxruntime]==2.1.0" "optimum-onnx==0.1.0" "transformers==4.57.6" \
    "onnxruntime==1.31.1" "torch==2.13.0" "sentencepiece>=0.2" "sacrebleu>=2.4"
"$venv/bin/python" -c "
import importlib.metadata as m
print(' '.join(f'{p}=={m.version(p)}' for p in ('optimum', 'optimum-onnx', 'transformers', 'onnxruntime', 'torch')))"
echo "Optimum environment ready: $venv"
