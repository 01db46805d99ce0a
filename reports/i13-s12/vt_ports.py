"""Virtual time (no lock): how far does the draw of engine ports alone move TTFT p99? The issue's workload (8 h100-8b
engines, 48 x 3,000-token prompts, 300-token questions, 100 output tokens) through the real scheduler (default
profile, flow control's candidate filter off), engines, prefix caches and load model (tests/unit/scheduling/
fleet_harness.py), deterministic: per seed, the same arrivals and prompts, only the engines' addresses
`127.0.0.1:<port>` differ (ports drawn as the bench's `free_ports` would: random in the ephemeral range).

    PYTHONPATH=. nice -n 10 .venv/bin/python reports/i13-s12/vt_ports.py [--popularity zipf:1.1] [--rate 60]
        [--warmup 5] [--draws 6] SEEDS...
"""

from __future__ import annotations

import argparse
import random

from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import shared_prefix_workload
from extproc.endpoints import Endpoint
from tests.unit.scheduling import fleet_harness


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--popularity", default="zipf:1.1")
    parser.add_argument("--rate", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("seeds", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    for seed in args.seeds:
        line = []
        for draw in range(args.draws):
            ports = random.Random(1000 * seed + draw).sample(range(32768, 61000), 8)

            def named(address: str, *a: object, ports: list[int] = ports, **k: object) -> Endpoint:
                index = int(address.split(":")[0].rsplit(".", 1)[1])
                return Endpoint(f"127.0.0.1:{ports[index]}", *a, **k)  # type: ignore[arg-type]

            shared = shared_prefix_workload("m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300),
                                            max_tokens=(100, 100), popularity=args.popularity, seed=seed)
            kv = kv_blocks_for(shared.prefix_working_set_tokens["chat"], 8)
            fleet_harness.Endpoint = named  # type: ignore[attr-defined,assignment]
            try:
                result = fleet_harness.run(shared.next_spec, args.rate, endpoints=8, kv_blocks=kv,
                                           warmup_s=args.warmup, duration_s=args.duration, seed=seed)
            finally:
                fleet_harness.Endpoint = Endpoint  # type: ignore[attr-defined]
            line.append(f"{result.ttft_percentile(99) * 1e3:.1f}")
        values = [float(v) for v in line]
        print(f"seed {seed} p99 ms per port draw: {' / '.join(line)} (max/min {max(values) / min(values):.2f})",
              flush=True)


if __name__ == "__main__":
    main()
