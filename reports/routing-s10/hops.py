"""Hop-by-hop split of client TTFT, per point of a `--samples` run (needs the per-request stamps of
extproc/sim/timings.py, session 10): every measured streamed request is joined to its engine's stamps by the
`x-sim-request` id; all stamps are CLOCK_MONOTONIC, so they subtract across processes.

    inbound   client send -> simulator handler starts (client, front door: Envoy [+ ext_proc] or the peer, upstream
              connection, simulator accept + header parse)
    read      handler starts -> body read + tokenized + submitted to the engine
    engine    submitted -> end of the step that sampled the first token (queue + prefill steps)
    emit      first token sampled -> first chunk handed to the simulator's transport (event-loop wake-up)
    outbound  first chunk written -> the client reads its first content event (front door's response path)

    .venv/bin/python reports/routing-s10/hops.py DIR [DIR...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

PARTS = ("inbound", "read", "engine", "emit", "outbound", "ttft")


def point_parts(point: Path) -> dict[str, np.ndarray]:
    stamps: dict[str, dict[str, float]] = {}
    for path in point.glob("sim-timings-*.json"):
        for item in json.loads(path.read_text()):
            stamps[item["id"]] = item
    rows: dict[str, list[float]] = {part: [] for part in PARTS}
    missing = 0
    for line in (point / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        if request["error"] is not None or request["ttft_s"] is None:
            continue
        stamp = stamps.get(request.get("sim_request") or "")
        if stamp is None or not stamp["written"]:
            missing += 1
            continue
        sent = request["sent_clock_s"]
        first = sent + request["ttft_s"]
        values = {"inbound": stamp["arrive"] - sent, "read": stamp["submit"] - stamp["arrive"],
                  "engine": stamp["token"] - stamp["submit"], "emit": stamp["written"] - stamp["token"],
                  "outbound": first - stamp["written"], "ttft": request["ttft_s"]}
        for part, value in values.items():
            rows[part].append(value * 1e3)
    result = {part: np.array(values) for part, values in rows.items()}
    result["missing"] = np.array([missing])
    return result


def describe(values: np.ndarray) -> str:
    if not len(values):
        return "-"
    return (f"{values.mean():6.2f} {np.percentile(values, 50):6.2f} {np.percentile(values, 90):6.2f} "
            f"{np.percentile(values, 99):6.2f}")


def show(name: str, parts: dict[str, np.ndarray]) -> None:
    print(f"## {name}: {len(parts['ttft'])} joined, {int(parts['missing'].sum())} unjoined (mean p50 p90 p99, ms)")
    for part in PARTS:
        print(f"  {part:9s} {describe(parts[part])}")
    # What the client saw minus what the engine did: the request path's share, per request.
    print(f"  {'ttft-eng':9s} {describe(parts['ttft'] - parts['engine'])}")
    # TTFT as it would be without one hop (per request), to see which hop the TTFT percentiles pay for.
    for part in ("inbound", "read", "emit", "outbound"):
        print(f"  {'w/o ' + part:13s} {describe(parts['ttft'] - parts[part])}")
    print(f"  {'engine only':13s} {describe(parts['engine'])}")


def main(runs: list[str]) -> None:
    pooled: dict[str, dict[str, list[np.ndarray]]] = {}
    for run in runs:
        for point in sorted(Path(run, "samples").iterdir()):
            parts = point_parts(point)
            show(point.name, parts)
            key = point.name.rpartition("-s")[0]
            for part, values in parts.items():
                pooled.setdefault(key, {}).setdefault(part, []).append(values)
    print("\n# seeds pooled")
    for key, lists in pooled.items():
        show(key, {part: np.concatenate(values) for part, values in lists.items()})


if __name__ == "__main__":
    main(sys.argv[1:])
