"""VT: per variant, every seed's TTFT p90 and p99 and their means (vtcold.py's runs); run from the repository root:
    .venv/bin/python reports/i15-s23/vt/vtseeds.py RATE POPULARITY SEEDS VARIANT..."""
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vtcold import one  # noqa: E402

if __name__ == "__main__":
    rate, pop, n, variants = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    with ProcessPoolExecutor(2) as ex:
        res = {v: list(ex.map(one, [(v, rate, pop, s) for s in range(n)])) for v in variants}
    for v in variants:
        print(f"{v or 'defaults':28s} p90 " + " ".join("%5.1f" % r[0] for r in res[v])
              + " | mean %.2f" % statistics.mean(r[0] for r in res[v]))
        print(f"{'':28s} p99 " + " ".join("%5.0f" % r[1] for r in res[v])
              + " | mean %.2f" % statistics.mean(r[1] for r in res[v]))
