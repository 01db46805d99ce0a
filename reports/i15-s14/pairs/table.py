"""Pooled rows of a `bench routing` results.json: strategy, load, hit (4 digits), TTFT p50/p90/p99 pooled, per-seed
p90/p99, engine-side p90/p99. python3 reports/i15-s14/pairs/table.py reports/i15-s14/pairs/NAME"""
import json
import sys
from pathlib import Path

for run in sys.argv[1:]:
    data = json.loads(Path(run, "results.json").read_text())
    rows = data["summary"] if isinstance(data, dict) else data
    for r in rows:
        p = r.get("pooled", {})
        print(f"{Path(run).name:8} {r['strategy']:20} load {r.get('load')} hit {p.get('hit_rate', r.get('hit_rate')):.4f} "
              f"p50 {p.get('ttft_p50_ms')} p90 {p.get('ttft_p90_ms')} p99 {p.get('ttft_p99_ms')} | seeds p90 "
              f"{r.get('ttft_p90_ms_range')} p99 {r.get('ttft_p99_ms_range')} | eng90/99 {r.get('eng_ttft_p90_ms', '-')}"
              f"/{r.get('eng_ttft_p99_ms', '-')} err {r.get('errors')}")
