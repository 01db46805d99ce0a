"""The measured requests of every point of a `--samples` run, each joined to its engine's stamps (`s`: arrive,
submit, token, written on CLOCK_MONOTONIC, or None; extproc/sim/timings.py). Shared by cold.py, coldrate.py, tail.py.
The hop split itself is reports/routing-s10/hops.py."""
import glob, json
from collections.abc import Iterator

COLD_UNCACHED = 1000  # prompt tokens not cached above which a request counts as a cold prefill (the bench's 3,300)


def points(run: str) -> Iterator[tuple[str, list[dict]]]:
    for where in sorted(glob.glob(run + "/samples/*")):
        rows = [json.loads(line) for line in open(where + "/requests.jsonl")]
        stamps = {}
        for path in glob.glob(where + "/sim-timings-*.json"):
            stamps.update((s["id"], s) for s in json.load(open(path)))
        for r in rows:
            r["s"] = stamps.get(r["sim_request"])
            r["cold"] = r["prompt_tokens"] - r["cached_tokens"] > COLD_UNCACHED
        yield where.split("/")[-1], rows


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0
