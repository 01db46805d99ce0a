"""Where our inbound hop (client send -> simulated engine's handler starts) goes, request by request, from a
`--samples` run of `extproc bench routing` at 4c318b7 or later (Envoy's timing log `envoy-timings.jsonl` next to
`requests.jsonl`, see extproc/bench/envoy_timings.py). Every stamp on CLOCK_MONOTONIC (Envoy's START_TIME moved
there by the recorded wall - monotonic offset). Parts, in ms:

    to_envoy   client send -> Envoy's first byte of the request (DS_RX_BEG): client write + Envoy's wake-up
    rx         DS_RX_BEG -> DS_RX_END: the rest of the request read (the buffer filter holds it until here)
    xp         ext_proc's own round trip (max of the headers' and body's latencies the filter measured: both
               messages leave together in prebuffered mode, one reply each, written together)
    gap        DS_RX_END -> US_TX_BEG minus xp: Envoy's work around the round trip (filter chain, route, pool,
               a new upstream connection when there is one), and ext_proc's send after DS_RX_END
    cx         a new upstream connection's connect time (US_CX_BEG -> US_CX_END), 0 for a pooled one
    tx         US_TX_BEG -> US_TX_END (the request written upstream)
    to_sim     US_TX_END -> the engine's handler starts (its event loop's wake-up + aiohttp's parse)
    inbound    client send -> engine's handler starts (the sum)

    .venv/bin/python reports/i15-s14/hop/split.py RUN_DIR [...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

PARTS = ("inbound", "to_envoy", "rx", "xp", "gap", "cx", "tx", "to_sim")


def _us(value: object) -> float | None:
    try:
        return float(str(value)) / 1e3
    except ValueError:
        return None


def point_rows(point: Path) -> tuple[list[dict[str, float]], int]:
    stamps: dict[str, dict[str, float]] = {}
    for path in point.glob("sim-timings-*.json"):
        for item in json.loads(path.read_text()):
            stamps[item["id"]] = item
    envoy: dict[str, dict[str, str]] = {}
    timings = point / "envoy-timings.jsonl"
    offset = 0.0
    if timings.exists():
        offset = json.loads((point / "clock-offset.json").read_text())["wall_minus_monotonic_s"]
        for line in timings.read_text().splitlines():
            item = json.loads(line)
            envoy[item["sim"]] = item
    rows: list[dict[str, float]] = []
    new_connections = 0
    for line in (point / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        stamp = stamps.get(request.get("sim_request") or "")
        if request["error"] is not None or stamp is None:
            continue
        sent = request["sent_clock_s"]
        row = {"inbound": (stamp["arrive"] - sent) * 1e3}
        item = envoy.get(request["sim_request"])
        if item is not None:
            begin = float(item["start"]) - offset  # DS_RX_BEG, monotonic seconds
            rx, tx_beg, tx_end = _us(item["ds_rx_end"]), _us(item["us_tx_beg"]), _us(item["us_tx_end"])
            xp = max(_us(item["xp_headers_us"]) or 0.0, _us(item["xp_body_us"]) or 0.0)
            cx_beg, cx_end = _us(item["us_cx_beg"]), _us(item["us_cx_end"])
            if rx is None or tx_beg is None or tx_end is None:
                continue
            cx = (cx_end - cx_beg) if cx_beg is not None and cx_end is not None else 0.0
            new_connections += cx_beg is not None
            row.update(to_envoy=(begin - sent) * 1e3, rx=rx, xp=xp,
                       gap=tx_beg - rx - xp, cx=cx, tx=tx_end - tx_beg,
                       to_sim=(stamp["arrive"] - begin) * 1e3 - tx_end)
        rows.append(row)
    return rows, new_connections


def describe(values: np.ndarray) -> str:
    if not len(values):
        return "-"
    return (f"{values.mean():6.2f} {np.percentile(values, 50):6.2f} {np.percentile(values, 90):6.2f} "
            f"{np.percentile(values, 99):6.2f}")


def show(name: str, rows: list[dict[str, float]], new_connections: int) -> None:
    print(f"## {name}: {len(rows)} requests, {new_connections} new upstream connections (mean p50 p90 p99, ms)")
    for part in PARTS:
        values = np.array([row[part] for row in rows if part in row])
        print(f"  {part:9s} {describe(values)}")
    timed = [row for row in rows if "xp" in row]
    if timed:
        # Which parts the slowest 10% of inbound hops spent their time in (mean over those requests).
        cut = np.percentile([row["inbound"] for row in timed], 90)
        slow = [row for row in timed if row["inbound"] >= cut]
        means = " ".join(f"{part} {np.mean([row[part] for row in slow]):.2f}" for part in PARTS)
        print(f"  slowest 10% (inbound >= {cut:.2f} ms, {len(slow)} requests), mean ms: {means}")


def main(runs: list[str]) -> None:
    for run in runs:
        pooled: dict[str, list[dict[str, float]]] = {}
        connections: dict[str, int] = {}
        for point in sorted(Path(run, "samples").iterdir()):
            rows, new = point_rows(point)
            show(point.name, rows, new)
            key = point.name.rpartition("-s")[0]
            pooled.setdefault(key, []).extend(rows)
            connections[key] = connections.get(key, 0) + new
        print("\n# seeds pooled")
        for key, rows in pooled.items():
            show(key, rows, connections[key])


if __name__ == "__main__":
    main(sys.argv[1:])
