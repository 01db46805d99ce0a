#!/bin/bash
# The real points in order, each its own hold of the lock (reports/i15-s13/run.sh), none started after 15:03 UTC
# (experiments stop at 15:15). Run from the worktree's root.
G="--scheduling $PWD/reports/i15-s13/gate.yaml --strategies default,gate,sglang-cache-aware --seed 0 --repeat 3"
C="--duration 20 --warmup 5 --stream-chunk-tokens 16 --samples"
S="--groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100"
while read -r name args; do
  [ "$(date -u +%H%M)" -ge 1503 ] && { echo "skipped $name (deadline)"; continue; }
  echo "$(date -u +%T) start $name"; reports/i15-s13/run.sh "$name" $args $G $C; echo "$(date -u +%T) done $name"
done <<LIST
mixed80 --workload mixed --loads 0.8
zipf80 --workload shared-prefix $S --popularity zipf:1.1 --loads 0.8
multiturn80 --workload multi-turn --loads 0.8
drift40 --workload drift $S --popularity zipf:1.1 --loads 0.4
LIST
