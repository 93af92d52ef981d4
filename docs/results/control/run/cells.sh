#!/bin/bash
# Issue 26's control test-split cells WITH the digit-swap draft (after e72e298). Resumable: rerun.
# As run on 2026-12-05 (from runs/); see log.txt.
cd "$(dirname "$0")/../../../.."  # the repository root; cells land in runs/cells/
export DIVERSED_DATA_DIR="$(cd .. && pwd)/shared/data"
COMMON="--dataset gsm8k --target embedded:qwen2.5-coder-1.5b --draft embedded:qwen2.5-coder-0.5b --dtype auto --draft-transform digit_swap --max-new-tokens 256 --num-assistant-tokens 4 --temperature 1.0 --seed 42 --batch-size 8 --no-hub --quiet"
N=${N:-100}
while read -r name args; do
  [ -z "$name" ] && continue
  echo "== $name n=$N start $(date -u +%H:%M:%S) commit $(git rev-parse --short HEAD)"
  .venv/bin/diversed decode $COMMON --n-examples "$N" $args --out "runs/cells/$name.jsonl" || { echo "FAILED $name"; continue; }
  .venv/bin/diversed score --dataset gsm8k --in "runs/cells/$name.jsonl" --out "runs/cells/$name-n$N.json" --no-hub
  echo "== $name done $(date -u +%H:%M:%S)"
done < docs/results/control/run/cells.txt
