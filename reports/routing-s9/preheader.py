"""Per point of a `--samples` run: the gateway's send delay (request start to first byte upstream) and the upstream's
time to answer with headers (the simulator's request handling before generation), means from the service
replicas' extproc_upstream_send_seconds and extproc_upstream_ttfb_seconds.

    .venv/bin/python reports/routing-s9/preheader.py reports/routing-s9/ab1-multi-turn80-new
"""

from __future__ import annotations

import sys
from pathlib import Path


def total(point: Path, name: str) -> float:
    value = 0.0
    for prom in point.glob("service-*.prom"):
        for line in prom.read_text().splitlines():
            if line.startswith((name + " ", name + "{")):
                value += float(line.rsplit(" ", 1)[1])
    return value


def main(run: str) -> None:
    for point in sorted(Path(run, "samples").iterdir()):
        sent = total(point, "extproc_upstream_send_seconds_sum") / total(point, "extproc_upstream_send_seconds_count")
        ttfb = total(point, "extproc_upstream_ttfb_seconds_sum") / total(point, "extproc_upstream_ttfb_seconds_count")
        print(f"{point.name}: send {sent * 1e3:.2f} ms, upstream headers {ttfb * 1e3:.2f} ms, "
              f"upstream's own share {(ttfb - sent) * 1e3:.2f} ms (means)")


if __name__ == "__main__":
    main(sys.argv[1])
