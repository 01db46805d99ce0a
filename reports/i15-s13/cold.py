"""Cold requests per strategy and seed in a `bench routing --samples` run: measured requests that found less than
half of their prompt cached (`cached_tokens` < `prompt_tokens` / 2), and the last one's start (s into the window).

    python3 reports/i15-s13/cold.py reports/i15-s13/NAME
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

for run in sys.argv[1:]:
    for samples in sorted(Path(run, "samples").iterdir()):
        cold = []
        with (samples / "requests.jsonl").open() as lines:
            for line in lines:
                r = json.loads(line)
                if r["error"] is None and r.get("cached_tokens") is not None and 2 * r["cached_tokens"] < r["prompt_tokens"]:
                    cold.append(r["start_s"])
        print(f"{run} {samples.name}: cold {len(cold)}, last at {max(cold, default=0):.1f} s")
