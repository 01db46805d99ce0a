"""Virtual time: critical TTFT p99 at 2x over its value at 0.7x (flow control on), 1 and 3 replicas, per seed.

Run: PYTHONPATH=. .venv/bin/python reports/i13-s11/vt_2x.py SEEDS...
"""

from __future__ import annotations

import sys

sys.path.insert(0, "reports/i13-s11")
import holds_vt  # noqa: E402

for replicas in (1, 3):
    for seed in [int(s) for s in sys.argv[1:]] or [1, 2, 3, 4, 5, 6]:
        calm, *_ = holds_vt.point(0.7, True, seed, replicas, 0.02)
        over, refused, _, _ = holds_vt.point(2.0, True, seed, replicas, 0.02)
        a, b = holds_vt.p99(calm["critical"]), holds_vt.p99(over["critical"])
        print(f"replicas {replicas} seed {seed}: critical p99 0.7x {a * 1000:.0f} ms, 2x {b * 1000:.0f} ms, "
              f"ratio {b / a:.2f}, refused {refused}", flush=True)
