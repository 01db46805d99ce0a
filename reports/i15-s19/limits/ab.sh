#!/bin/bash
# extproc bench limits (3 replicas sharing Redis, one tenant at 5x its tokens per minute) before the slices fix
# (a149709) and after it (main), alternating
O=/work/main/reports/i15-s19/limits
for round in 1 2; do
  (cd /work/wt/before && PYTHONPATH=. .venv/bin/python -m extproc bench limits --duration 60 --baseline 30 --json $O/before-r$round.json > $O/before-r$round.log 2>&1)
  (cd /work/main && .venv/bin/python -m extproc bench limits --duration 60 --baseline 30 --json $O/after-r$round.json > $O/after-r$round.log 2>&1)
done
