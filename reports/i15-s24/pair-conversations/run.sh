#!/bin/bash
# on vs off in one run: the multi-turn case with the peers, then agents
set -e
T=$(mktemp -d /tmp/s24v.XXXX); git -C /work/main archive f644d22 | tar -x -C $T
out=/work/main/reports/i15-s24/pair-conversations; mkdir -p $out
flock /work/wt/bench.lock bash -c "cd $T && echo \"multi-turn: f644d22 $(date -u +%FT%TZ) $(uptime)\" >> $out/uptime.txt && PYTHONPATH=$T /work/main/.venv/bin/python -m extproc bench routing-suite --cases multi-turn --strategies default,noconv,sglang-cache-aware,vllm-router-cache-aware --scheduling $T/reports/i15-s24/noconv.yaml --repeat 3 --duration 20 --warmup 5 --out $out/suite > $out/multi-turn.log 2>&1; echo \"agents: $(date -u +%FT%TZ) $(uptime)\" >> $out/uptime.txt; PYTHONPATH=$T /work/main/.venv/bin/python -m extproc bench routing --workload agents --strategies default,noconv --scheduling $T/reports/i15-s24/noconv.yaml --repeat 2 --duration 20 --warmup 5 --out $out/agents > $out/agents.log 2>&1; echo \"done: $(date -u +%FT%TZ)\" >> $out/uptime.txt"
rm -rf $T
