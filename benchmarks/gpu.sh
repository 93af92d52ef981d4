#!/usr/bin/env bash
# The GPU check of issue "batched engine": random-weight Llama-3.1-8B / Llama-3.2-1B shapes in bf16,
# target step time against the HBM floor, ours vs HF assisted at batch 1, ours at larger batches.
#   bash benchmarks/gpu.sh                                   # on a CUDA machine
#   bash benchmarks/gpu.sh --shapes tiny --device cpu --dtype float32   # anywhere (the test suite does)
# Uses .venv/bin/python when present, else $PYTHON (default python3) with diversed importable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
"$PY" -c "import diversed" 2>/dev/null || "$PY" -m pip install --quiet -e .
exec "$PY" benchmarks/gpu_bench.py "$@"
