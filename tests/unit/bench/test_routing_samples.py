"""What `extproc bench routing --samples` writes per point (extproc/bench/routing_samples.py)."""

from __future__ import annotations

import json
from pathlib import Path

from extproc.bench.loadgen import Sample
from extproc.bench.routing_samples import write_point


def test_a_point_keeps_the_send_clock_and_the_simulators_request_id(tmp_path: Path) -> None:
    sample = Sample(7, {"pool": "chat"}, 1.5, 0.0, 200, None, 0.04, 0.9, stream=True, cached_tokens=3000,
                    headers={"x-sim-replica": "127.0.0.1:9001", "x-sim-request": "9001-12"}, sent_clock_s=1234.5)
    write_point(tmp_path, [sample], {"sim-9001": "vllm:x 1\n", "sim-timings-9001": '[{"id": "9001-12"}]'})
    record = json.loads((tmp_path / "requests.jsonl").read_text())
    assert record["sent_clock_s"] == 1234.5 and record["sim_request"] == "9001-12"
    assert record["endpoint"] == "127.0.0.1:9001" and record["ttft_s"] == 0.04
    assert json.loads((tmp_path / "sim-timings-9001.json").read_text()) == [{"id": "9001-12"}]
    assert (tmp_path / "sim-9001.prom").read_text() == "vllm:x 1\n"
