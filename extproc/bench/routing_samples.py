"""`extproc bench routing --samples`: the raw material behind a point, for diagnosis.

Per point, under OUT/samples/<strategy>-q<rate>-s<seed>/: `requests.jsonl` (one line per measured request: when
it was sent, TTFT, end-to-end time, the endpoint that served it, cached tokens, the workload's labels) and the
/metrics text of every service replica (`service-<admin port>.prom`) and simulated engine (`sim-<port>.prom`)
after the run, and each engine's per-request stamps (`sim-timings-<port>.json`, joined to a request by its
`sim_request` id, on the same clock as `sent_clock_s`), so that per-endpoint and per-replica questions (where did
the slow requests go, which replica decided them, how late its event loop ran, which hop took the time) can be
answered after the fact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.loadgen import Sample
from extproc.sim.timings import HEADER as SIM_HEADER

__all__ = ["dump_point", "sample_record", "write_point"]


def sample_record(sample: Sample) -> dict[str, object]:
    endpoint = sample.headers.get("x-gateway-upstream-host") or sample.headers.get("x-sim-replica")
    return {"index": sample.index, "start_s": round(sample.start_s, 6), "late_s": round(sample.late_s, 6),
            "status": sample.status, "error": sample.error,
            "ttft_s": None if sample.ttft_s is None else round(sample.ttft_s, 6), "e2e_s": round(sample.e2e_s, 6),
            "endpoint": endpoint, "cached_tokens": sample.cached_tokens, "prompt_tokens": sample.prompt_tokens,
            "labels": dict(sample.labels), "sent_clock_s": sample.sent_clock_s,
            "sim_request": sample.headers.get(SIM_HEADER)}


async def _metrics_text(client: HttpClient, port: int, path: str = "/metrics") -> str | None:
    try:
        response = await client.request("GET", "127.0.0.1", port, path, timeout_s=5.0)
    except RequestError:
        return None
    return response.body.decode("utf-8", "replace") if response.status == 200 else None


async def dump_point(client: HttpClient, where: Path, samples: Sequence[Sample], admin_ports: Sequence[int],
                     engines: Sequence[str]) -> None:
    named = [(f"service-{port}", port) for port in admin_ports]
    named += [(f"sim-{address.rpartition(':')[2]}", int(address.rpartition(":")[2])) for address in engines]
    texts = {name: await _metrics_text(client, port) for name, port in named}
    for address in engines:  # per-request stamps (extproc/sim/timings.py), joined to requests.jsonl by sim_request
        port = int(address.rpartition(":")[2])
        texts[f"sim-timings-{port}"] = await _metrics_text(client, port, "/sim/timings")
    write_point(where, samples, {name: text for name, text in texts.items() if text is not None})


def write_point(where: Path, samples: Sequence[Sample], metrics: dict[str, str]) -> None:
    where.mkdir(parents=True, exist_ok=True)
    with (where / "requests.jsonl").open("w") as out:
        for sample in samples:
            out.write(json.dumps(sample_record(sample), separators=(",", ":")) + "\n")
    for name, text in metrics.items():
        (where / (f"{name}.json" if name.startswith("sim-timings-") else f"{name}.prom")).write_text(text)
