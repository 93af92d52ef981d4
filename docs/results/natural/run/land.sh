#!/bin/bash
# Commit every finished cell of run/cells.sh that is not in docs/results/natural/cells/ yet, one commit
# per cell (run it between cells, or in a loop beside cells.sh: it takes only scored cells).
cd "$(dirname "$0")/../../../.."
N=${N:-200}
for score in runs/natural/*/*-n"$N".json; do
  [ -e "$score" ] || continue
  dataset=$(basename "$(dirname "$score")")
  name=$(basename "$score" "-n$N.json")
  dest="docs/results/natural/cells/$dataset-$name.json"
  [ -e "$dest" ] && continue
  cp "$score" "$dest"
  git add "$dest" && git commit -q -m "natural study: $dataset test-split cell $name, n = $N (natural pair)" -- "$dest" && echo "landed $dest"
done
