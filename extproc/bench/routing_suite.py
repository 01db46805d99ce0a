"""`extproc bench routing-suite`: every routing workload at 40% and 80% of the fleet's capacity, every strategy
(ours, the peer routers, Envoy's own), several seeds, and the verdicts of issue 15's acceptance.

Cases (8 simulated replicas each): the shared-prefix workload of the issue (48 system prompts of 3,000 tokens,
300-token questions, 100 output tokens) with uniform and Zipf 1.1 popularity, multi-turn, mixed (one pool) and
drift. Each case is one `extproc bench routing` run (strategies interleaved at each load and seed) writing its own
report under `<out>/<case>/`; uniform and multi-turn also run `default@3` (three service replicas sharing Redis)
next to `default`. Then `<out>/README.md` gathers one table per case and the verdicts:

- per case and load, ours (`default`: flow control on, as shipped) against the best peer whose policy was in
  effect at every seed: TTFT p90 and p99 <= the best peer's, hit rate >= the best peer's - 2 points, all of them
  pooled over the seeds (routing_pool.py: a seed's p99 is a handful of requests, so the median of seed p99s is
  one seed's handful); the seeds' medians and ranges are printed next to each verdict;
- Zipf 1.1 at 80%: our TTFT p90 <= 1/5 of sglang-router's;
- `default@3` within 5 points of hit rate and 10% of TTFT p90 of `default` (uniform, multi-turn); the engines' own
  p90 ratio (from their TTFT histograms) is printed next to it: how much of the ratio is routing, not the path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.bench.peers import PEERS
from extproc.bench.report import format_markdown_table
from extproc.bench.routing import run_routing
from extproc.bench.routing_plan import ISOLATE_DEFAULT
from extproc.bench.routing_plan import configure as configure_routing

__all__ = ["CASES", "configure", "run_suite", "verdicts"]

OURS = "default"
REPLICATED = f"{OURS}@3"
DEFAULT_STRATEGIES = (f"{OURS},{OURS}+noflow,sglang-cache-aware,vllm-router-cache-aware,vllm-router-power-of-two,"
                      "envoy-round-robin,envoy-least-request")
_ISSUE_SHAPE = ("--groups", "48", "--prefix-tokens", "3000", "--question-tokens", "300", "--output-tokens", "100")


@dataclass(frozen=True)
class Case:
    name: str
    workload: str
    options: tuple[str, ...] = ()
    replicas_check: bool = False


CASES = (
    Case("uniform", "shared-prefix", (*_ISSUE_SHAPE, "--popularity", "uniform"), replicas_check=True),
    Case("zipf", "shared-prefix", (*_ISSUE_SHAPE, "--popularity", "zipf:1.1")),
    Case("multi-turn", "multi-turn", replicas_check=True),
    Case("mixed", "mixed"),
    Case("drift", "drift", (*_ISSUE_SHAPE, "--popularity", "zipf:1.1")),
)
_TABLE = [("strategy", "strategy"), ("load", "load"), ("qps", "req/s"), ("pooled.requests", "requests"),
          ("pooled.hit_rate", "hit"), ("hit_rate", "hit med"), ("hit_rate_range", "hit range"),
          ("pooled.ttft_p50_ms", "TTFT p50"), ("pooled.ttft_p90_ms", "p90"), ("ttft_p90_ms", "p90 med"),
          ("ttft_p90_ms_range", "p90 range"), ("pooled.ttft_p99_ms", "p99"), ("ttft_p99_ms", "p99 med"),
          ("ttft_p99_ms_range", "p99 range"), ("tpot_p50_ms", "TPOT p50"), ("goodput_rps", "goodput"),
          ("errors", "err"), ("peer_ok", "peer ok"), ("max_cores", "max core")]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default=",".join(c.name for c in CASES),
                        help="comma list of cases to run (default %(default)s)")
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                        help=f"comma list of strategies for every case (default %(default)s; {REPLICATED} is added "
                             "to the cases that check three service replicas)")
    parser.add_argument("--loads", default="0.4,0.8", help="shares of the fleet's capacity (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="seeds per point (default %(default)s)")
    parser.add_argument("--duration", type=float, default=25.0, help="measured seconds per point (default 25)")
    parser.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds per point (default 5)")
    parser.add_argument("--stream-chunk-tokens", type=int, default=16,
                        help="tokens per SSE chunk from the simulator: fewer chunks leave more of a small machine's "
                             "CPU to the engines and routers (TTFT is the first token, sent alone) (default 16)")
    parser.add_argument("--scheduling", default=None, metavar="FILE",
                        help="YAML of extra scheduling plugins and profiles for every case (see extproc bench "
                             "routing --help); --strategies may name its profiles")
    parser.add_argument("--samples", action="store_true",
                        help="also write every measured request and the processes' /metrics per point under "
                             "<out>/<case>/samples/ (see extproc bench routing --help; for diagnosis)")
    parser.add_argument("--isolate", default=ISOLATE_DEFAULT, metavar="auto|off|CPUS",
                        help="the system under test's CPUs apart from the harness's (see extproc bench routing "
                             "--help) (default %(default)s)")
    parser.add_argument("--out", default="reports/routing", help="report directory (default %(default)s)")
    parser.add_argument("--summary-only", action="store_true",
                        help="run nothing: rebuild <out>/README.md from the cases' results.json")


def _case_args(case: Case, args: argparse.Namespace, out: Path) -> argparse.Namespace:
    strategies = args.strategies + (f",{REPLICATED}" if case.replicas_check and OURS in args.strategies else "")
    parser = argparse.ArgumentParser()
    configure_routing(parser)
    argv = ["--workload", case.workload, *case.options, "--strategies", strategies, "--loads", args.loads,
            "--repeat", str(args.repeat), "--duration", f"{args.duration:g}", "--warmup", f"{args.warmup:g}",
            "--stream-chunk-tokens", str(args.stream_chunk_tokens), "--out", str(out / case.name),
            "--isolate", args.isolate,
            *(("--scheduling", args.scheduling) if args.scheduling else ()), *(("--samples",) if args.samples else ())]
    parsed = parser.parse_args(argv)
    parsed.command = "extproc bench routing " + " ".join(argv)
    return parsed


def _by_load(summary: Sequence[Mapping[str, Any]]) -> dict[float, dict[str, Mapping[str, Any]]]:
    rows: dict[float, dict[str, Mapping[str, Any]]] = {}
    for row in summary:
        rows.setdefault(float(row.get("load") or row["qps"]), {})[row["strategy"]] = row
    return rows


def _judged(row: Mapping[str, Any] | None) -> bool:
    """Whether the row has the pooled figures a verdict needs."""
    pooled = (row or {}).get("pooled") or {}
    return all(pooled.get(k) is not None for k in ("ttft_p90_ms", "ttft_p99_ms", "hit_rate"))


def _pooled(row: Mapping[str, Any], key: str) -> float:
    """A pooled figure of a row that _judged() accepted."""
    return float(row["pooled"][key])


def _seeds(row: Mapping[str, Any], key: str) -> str:
    """The seeds' median and range of `key`, for the record next to a pooled verdict."""
    spread = row.get(f"{key}_range")
    return f"{row.get(key)}" + (f" [{spread}]" if spread else "")


def _compare(ours: Mapping[str, Any], best: Mapping[str, Any], key: str, what: str) -> str:
    """PASS / FAIL for ours <= best on the pooled `key` (a latency); the seeds' medians [ranges] follow."""
    mine, theirs = _pooled(ours, key), _pooled(best, key)
    verdict = f"PASS {what} {mine:g} <= {theirs:g}" if mine <= theirs else f"FAIL {what} {mine:g} > {theirs:g}"
    return f"{verdict} ({best['strategy']}; seed medians {_seeds(ours, key)} vs {_seeds(best, key)})"


def _engines_ratio(replicated: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """The engines' own TTFT p90 (their histograms: no proxy path, no CPU contention on it) of the replicated run over
    one replica's, for the record next to the verdict: what of the ratio is routing rather than the request path."""
    theirs, mine = ((row.get("engine_ttft_ms") or {}).get("p90") for row in (replicated, ours))
    return f" (engines' own p90 x{theirs / mine:.2f})" if theirs and mine else ""


def verdicts(case: str, summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """Issue 15's acceptance per load, on TTFT percentiles and hit rate pooled over the seeds (`pooled` of each
    summary row, routing_pool.py): a row without them (a results.json from before pooling) is not judged."""
    lines = []
    for load, rows in sorted(_by_load(summary).items()):
        ours = rows.get(OURS)
        peers = [r for name, r in rows.items() if name in PEERS and r.get("peer_ok") and _judged(r)]
        skipped = [name for name, r in rows.items() if name in PEERS and not r.get("peer_ok")]
        where = f"{case} @ {load:g}"
        if ours is None or not _judged(ours) or not peers:
            state = "missing" if ours is None else "present" if _judged(ours) else "not pooled"
            lines.append(f"- {where}: not measured (ours {state}, pooled peers {len(peers)})")
            continue
        best90 = min(peers, key=lambda r: _pooled(r, "ttft_p90_ms"))
        best99 = min(peers, key=lambda r: _pooled(r, "ttft_p99_ms"))
        best_hit = max(peers, key=lambda r: _pooled(r, "hit_rate"))
        hit, best = _pooled(ours, "hit_rate"), _pooled(best_hit, "hit_rate")
        parts = [_compare(ours, best90, "ttft_p90_ms", "p90"), _compare(ours, best99, "ttft_p99_ms", "p99"),
                 f"{'PASS' if hit >= best - 0.02 else 'FAIL'} hit {hit:g} vs {best:g} ({best_hit['strategy']}) - 0.02"]
        p90 = _pooled(ours, "ttft_p90_ms")
        sglang = rows.get("sglang-cache-aware")
        if case == "zipf" and load >= 0.8 and sglang is not None and _judged(sglang):
            theirs = _pooled(sglang, "ttft_p90_ms")
            ratio = p90 / theirs if theirs else float("inf")
            parts.append(f"{'PASS' if ratio <= 0.2 else 'FAIL'} p90 / sglang's p90 = {ratio:.3f} (<= 0.2)")
        replicated = rows.get(REPLICATED)
        if replicated is not None and _judged(replicated):
            their_hit = _pooled(replicated, "hit_rate")
            p90_ratio = _pooled(replicated, "ttft_p90_ms") / p90 if p90 else float("inf")
            ok = hit - their_hit <= 0.05 and p90_ratio <= 1.10
            parts.append(f"{'PASS' if ok else 'FAIL'} {REPLICATED}: hit {their_hit:g} (-{hit - their_hit:.3f}), "
                         f"p90 x{p90_ratio:.2f}{_engines_ratio(replicated, ours)}")
        if skipped:
            parts.append(f"peers whose policy was not in effect (excluded): {', '.join(skipped)}")
        lines.append(f"- {where}: " + "; ".join(parts))
    return lines


def summary_markdown(out: Path, cases: Sequence[Case]) -> str:
    parts = ["# Routing against the peer routers (issue 15)\n",
             "Produced by `extproc bench routing-suite` (see `extproc/bench/routing_suite.py` for the cases and the "
             "verdict rules). Each case's full report (every point, CPU per process, plots) is in its directory. "
             "hit, TTFT p50, p90 and p99 are pooled over the seeds (percentiles of every seed's requests together; "
             "hit tokens / query tokens summed over the seeds) and the verdicts judge those; med = the median of the "
             "seeds' own values, range = their min-max; TPOT and goodput are medians; latency in ms.\n"]
    for case in cases:
        path = out / case.name / "results.json"
        if not path.exists():
            parts.append(f"## {case.name}\n\nnot run\n")
            continue
        report = json.loads(path.read_text())
        summary = report.get("summary", [])
        capacity = report.get("capacity", {})
        parts.append(f"## {case.name} (`--workload {case.workload} {' '.join(case.options)}`)\n")
        parts.append(f"Capacity {capacity.get('rps')} req/s; seeds {report.get('seeds')}; "
                     f"{report.get('duration_s')} s measured per point. "
                     f"[report]({case.name}/results.md), [TTFT]({case.name}/ttft_vs_load.png), "
                     f"[hit rate]({case.name}/hit_rate_vs_load.png)\n")
        parts.append(format_markdown_table(summary, _TABLE))
        parts.append("\n" + "\n".join(verdicts(case.name, summary)) + "\n")
    return "\n".join(parts)


async def run_suite(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    cases = [c for c in CASES if c.name in names]
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown or not cases:
        print(f"error: unknown cases {unknown}; known: {', '.join(c.name for c in CASES)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    status = 0
    started = time.perf_counter()
    if not args.summary_only:
        for case in cases:
            print(f"== case {case.name}", file=sys.stderr)
            status = max(status, await run_routing(_case_args(case, args, out)))
    readme = out / "README.md"
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text(summary_markdown(out, [c for c in CASES if c.name in names]), encoding="utf-8")
    print(readme.read_text())
    print(f"suite wall time {time.perf_counter() - started:.0f} s; summary {readme}", file=sys.stderr)
    return status
