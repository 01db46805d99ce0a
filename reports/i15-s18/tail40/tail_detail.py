"""Session 18: the 16 slowest requests of one `--samples` point (run from the repo root): when sent, TTFT, sent ->
engine arrival, sent -> engine submit (pre), in the engine (eng), after (post), endpoint, cached tokens.
Usage: python reports/i15-s18/tail40/tail_detail.py OUT/samples/<point>"""
import json, sys
from pathlib import Path
sys.path.insert(0, "reports/i15-s18/tail40")
from tails import load
point = Path(sys.argv[1])
reqs, stamps = load(point)
ok = [r for r in reqs if r["ttft_s"] is not None and r.get("sim_request") in stamps]
t0 = min(r["sent_clock_s"] for r in ok)
for r in ok:
    s = stamps[r["sim_request"]]
    r["pre"] = (s["submit"] - r["sent_clock_s"]) * 1000; r["arr"] = (s["arrive"] - r["sent_clock_s"]) * 1000
    r["eng"] = (s["token"] - s["submit"]) * 1000
    r["post"] = r["ttft_s"] * 1000 - r["pre"] - r["eng"]
ok.sort(key=lambda r: -r["ttft_s"])
for r in ok[:16]:
    print(f"t={r['sent_clock_s']-t0:7.3f} ttft={r['ttft_s']*1000:6.1f} arr={r['arr']:5.1f} pre={r['pre']:5.1f} eng={r['eng']:5.1f} post={r['post']:5.1f} ep={r['endpoint'][-5:]} cached={r['cached_tokens']}/{r['prompt_tokens']}")
