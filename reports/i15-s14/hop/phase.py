"""Inbound parts by the phase (10 ms bins of CLOCK_MONOTONIC mod 100 ms) of when they happened, per point: a 100 ms periodic burst (scrapes, flushes) shows as a bin above the others. Session-14 diagnosis; usage: phase.py POINT_DIR"""
import json, sys, numpy as np
from pathlib import Path
sys.path.insert(0, "reports/i15-s14/hop")
point = Path(sys.argv[1])
stamps = {}
for p in point.glob("sim-timings-*.json"):
    for it in json.loads(p.read_text()): stamps[it["id"]] = it
env = {}
off = json.loads((point/"clock-offset.json").read_text())["wall_minus_monotonic_s"] if (point/"clock-offset.json").exists() else None
if off is not None:
    for l in (point/"envoy-timings.jsonl").read_text().splitlines():
        it = json.loads(l); env[it["sim"]] = it
ph_sim, ts, ph_x, xs, inb, ph_in = [], [], [], [], [], []
for l in (point/"requests.jsonl").read_text().splitlines():
    r = json.loads(l); s = stamps.get(r.get("sim_request") or "")
    if s is None or r["error"]: continue
    inb.append((s["arrive"]-r["sent_clock_s"])*1e3); ph_in.append(r["sent_clock_s"] % 0.1)
    e = env.get(r["sim_request"])
    if e:
        b = float(e["start"]) - off
        txe = b + float(e["us_tx_end"])/1e6
        ph_sim.append(txe % 0.1); ts.append((s["arrive"]-txe)*1e3)
        rx = b + float(e["ds_rx_end"])/1e6
        ph_x.append(rx % 0.1); xs.append(max(float(e["xp_headers_us"]), float(e["xp_body_us"]))/1e3)
def show(name, ph, v):
    ph, v = np.array(ph), np.array(v)
    if not len(v): return
    bins = (ph*1000//10).astype(int)
    print(name, " ".join(f"{np.mean(v[bins==i]):4.1f}/{np.percentile(v[bins==i],90):4.1f}" for i in range(10)))
show("to_sim by tx_end phase (10ms bins) mean/p90:", ph_sim, ts)
show("xp by rx_end phase:", ph_x, xs)
show("inbound by send phase:", ph_in, inb)
