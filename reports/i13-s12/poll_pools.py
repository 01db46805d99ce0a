"""Poll the service's /debug/pools during a `bench routing --workdir WORKDIR` run (one service replica): for every
point directory that appears under WORKDIR, read the service's admin port from its policy.yaml and GET
/debug/pools every INTERVAL s while it answers; append one JSON line per poll that shows something the load model
decided (an endpoint with a capacity, room <= 0 or a queue it counts), plus one summary line per point, to OUT.

    python3 reports/i13-s12/poll_pools.py WORKDIR OUT [INTERVAL]   (stops when killed)
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path


def admin_port(policy: Path) -> int | None:
    match = re.search(r"^service:\n(?:  .*\n)*?  admin_port: (\d+)", policy.read_text(), re.M)
    return int(match.group(1)) if match else None


def main(workdir: str, out: str, interval: float = 0.2) -> None:
    done: set[str] = set()
    with open(out, "a") as log:
        while True:
            points = sorted(Path(workdir).glob("*/policy.yaml"), key=lambda p: p.stat().st_mtime)
            fresh = [p for p in points if p.parent.name not in done]
            if not fresh:
                time.sleep(0.5)
                continue
            policy = fresh[-1]
            port = admin_port(policy)
            name = policy.parent.name
            polls = flagged = 0
            caps: dict[str, float] = {}
            answered = False
            misses = 0
            while misses < 50:  # ~10 s without an answer: the point is over
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pools", timeout=1.0) as response:
                        data = json.load(response)
                    answered, misses = True, 0
                except Exception:
                    misses += 1
                    time.sleep(interval)
                    continue
                polls += 1
                now = time.time()
                for pool, endpoints in data["pools"].items():
                    odd = [e for e in endpoints if e["capacity"] is not None or e["room"] in (0, 0.0)
                           or (e["queued_for_s"] or 0) > 0.3]
                    for e in endpoints:
                        if e["capacity"] is not None:
                            caps[e["address"]] = e["capacity"]
                    if odd:
                        flagged += 1
                        log.write(json.dumps({"point": name, "t": round(now, 3), "pool": pool, "endpoints": odd})
                                  + "\n")
                time.sleep(interval)
            if answered or len(points) > len(done) + 1:
                done.add(name)
            log.write(json.dumps({"point": name, "summary": True, "polls": polls, "flagged": flagged,
                                  "capacities": caps}) + "\n")
            log.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4]))
