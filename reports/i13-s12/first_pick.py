"""Request 0 of each point (a new prompt on an idle fleet): did it go to the endpoint its anchor block's rendezvous
hash ranks first over that point's engine addresses? (The tie-break of the prefix scorer; ports differ per point.)

    python3 reports/i13-s12/first_pick.py RUN_DIR...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from pairs import point  # noqa: E402
from ranks import anchors  # noqa: E402

from extproc.scheduling.prefix import rendezvous  # noqa: E402

top = total = 0
for run in map(Path, sys.argv[1:]):
    meta = json.loads((run / "results.json").read_text())
    for row in meta["points"]:
        strategy, rate, seed = row["strategy"], row["qps"], row["seed"]
        addresses = yaml.safe_load((Path(meta["workdir"]) / f"s{seed}-{strategy}-q{rate:g}" / "policy.yaml")
                                   .read_text())["pools"][0]["endpoints"]
        first = point(run, meta, row)[0]
        key = anchors(meta, seed, rate)[first["group"]]
        best = max(range(len(addresses)), key=lambda i: rendezvous(key, addresses[i]))
        top += best == first["engine"]
        total += 1
print(f"request 0 went to its rendezvous-first engine in {top} of {total} points")
