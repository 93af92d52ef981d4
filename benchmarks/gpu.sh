#!/usr/bin/env bash
# The engine on a GPU against the HBM floor and HF (issue 28), offline: random-weight Llama-3.1-8B
# shapes with a perturbed self-draft, bf16; fp32 exactness on the device. Nothing is installed.
#   bash benchmarks/gpu.sh --out gpu.json                                  # on a CUDA machine, <= 3 min on an H200
#   bash benchmarks/gpu.sh --shapes tiny --device cpu --dtype float32       # anywhere (the test suite does)
# Python: $PYTHON when set, else .venv/bin/python when present, else python3; this checkout is put
# on PYTHONPATH, so diversed needs no install, only its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
PY="${PYTHON:-$PY}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$PY" - <<'PY'
import importlib.util
need = ["torch", "transformers", "jsonschema", "yaml", "numpy"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "benchmarks/gpu.sh: $PY lacks: $missing (offline: carry them as wheels and pip install --no-index them)" >&2
  exit 2
fi
exec "$PY" benchmarks/gpu_bench.py "$@"
