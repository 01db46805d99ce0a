"""`extproc bench soak`, run short: real Envoy, the service on each front end, Redis leases, clients cutting
requests; the report says what was held at the end (nothing) and samples the service's memory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from extproc.bench.soak import configure, run_soak
from tests.integration.limits.redis_server import redis_server_binary

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("front_end", ["lean", "grpcio"])
async def test_a_short_soak_leaves_nothing_held(tmp_path: Path, front_end: str) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    report_path = tmp_path / "soak.json"
    args = parser.parse_args(["--rate", "80", "--duration", "4", "--sample-interval", "1", "--abort", "0.4",
                              "--front-end", front_end, "--redis-server", redis_server_binary(),
                              "--json", str(report_path), "--workdir", str(tmp_path / "work")])
    assert await run_soak(args) == 0
    report = json.loads(report_path.read_text())
    assert report["front_end"] == front_end and report["requests"] >= 250 and report["aborted"] >= 50
    assert report["errors"] == {} and report["held_after"] == {
        "service_in_flight": 0, "endpoint_in_flight": 0, "redis_leases": 0}
    assert len(report["samples"]) >= 3 and all(s["rss_kib"] > 0 for s in report["samples"])
