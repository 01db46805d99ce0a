#!/bin/bash
# Zipf 1.1 80% and mixed 80% in one hold of the lock, from an archive of HEAD: reports/i15-s14/pairs/zm.sh
set -e
W=$(pwd); S="--workload shared-prefix --groups 48 --prefix-tokens 3000 --question-tokens 300 --output-tokens 100"
T=$(mktemp -d /tmp/s14-pairs-tree.XXXX); git archive HEAD | tar -x -C "$T"; REV=$(git rev-parse --short HEAD)
C="--strategies default,life,sglang-cache-aware --scheduling $W/reports/i15-s14/pairs/life.yaml --loads 0.8 --seed 0 --repeat 3 --duration 20 --warmup 5 --stream-chunk-tokens 16 --samples"
exec flock /work/wt/bench.lock bash -c '
  W=$1; T=$2; REV=$3; S=$4; C=$5
  for point in "z80:$S --popularity zipf:1.1" "mixed80:--workload mixed"; do
    name=${point%%:*}; args=${point#*:}; out=$W/reports/i15-s14/pairs/$name; mkdir -p "$out"
    echo "commit: $REV  command: extproc bench routing $args $C --out $out" > "$out/uptime.txt"
    echo "before: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
    (cd "$T" && PYTHONPATH=$T "$W/.venv/bin/python" -m extproc bench routing $args $C --out "$out" > "$out/stdout.txt" 2>&1) \
      || echo "exit $?" >> "$out/uptime.txt"
    echo "after: $(date -u +%FT%TZ) $(uptime) psi-cpu: $(head -1 /proc/pressure/cpu)" >> "$out/uptime.txt"
  done
  rm -rf "$T"
' _ "$W" "$T" "$REV" "$S" "$C"
