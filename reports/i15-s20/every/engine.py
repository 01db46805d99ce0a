"""Engine-side TTFT p90 (the simulator's submit -> first token, pooled over a run's seeds), one vs three replicas, per run
directory: the routing's own share of the ratio, without the ext_proc path's CPU contention.

    python3 engine.py DIR...
"""
import json, sys

for run in sys.argv[1:]:
    res = json.load(open(f"{run}/results.json"))
    e = {s["strategy"]: s["engine_ttft_ms"]["p90"] for s in res["summary"]}
    c = {s["strategy"]: s["pooled"]["ttft_p90_ms"] for s in res["summary"]}
    print(f"{run}: engine p90 one {e['default']:.1f} three {e['default@3']:.1f} x{e['default@3'] / e['default']:.2f}"
          f" | client p90 one {c['default']:.1f} three {c['default@3']:.1f} x{c['default@3'] / c['default']:.2f}")
