#!/bin/bash
# Issue 26 item 3 (config/natural.yaml's settings): the natural pair's cells, decoded by the CLI one at
# a time so that each finished cell can be committed as it lands (a session's machine may not survive
# to the next). Resumable: rerun. DATASET=mbpp for MBPP; LIST names the cells: run/cells.txt (default,
# those that need no head) or run/heads.txt (DIVERSED from each committed head, then the static cell
# at that head's own mean w on its decoded tokens); "{dataset}" in a line's arguments is $DATASET.
cd "$(dirname "$0")/../../../.."  # the repository root; cells land in runs/natural/
export DIVERSED_DATA_DIR="${DIVERSED_DATA_DIR:-$(cd .. && pwd)/shared/data}"
DATASET=${DATASET:-gsm8k}
N=${N:-200}
LIST=${LIST:-docs/results/natural/run/cells.txt}
COMMON="--dataset $DATASET --target embedded:qwen2.5-coder-1.5b --draft embedded:qwen2.5-coder-0.5b --dtype auto --quantize auto --max-new-tokens 256 --num-assistant-tokens 4 --temperature 1.0 --seed 42 --batch-size 8 --no-hub --quiet"
mkdir -p "runs/natural/$DATASET"
while read -r name args; do
  [ -z "$name" ] && continue
  args=${args//\{dataset\}/$DATASET}
  out="runs/natural/$DATASET/$name"
  echo "== $DATASET $name n=$N start $(date -u +%H:%M:%S) commit $(git rev-parse --short HEAD)"
  .venv/bin/diversed decode $COMMON --n-examples "$N" $args --out "$out.jsonl" || { echo "FAILED $name"; continue; }
  .venv/bin/diversed score --dataset "$DATASET" --in "$out.jsonl" --out "$out-n$N.json" --no-hub
  echo "== $DATASET $name done $(date -u +%H:%M:%S)"
done < "$LIST"
