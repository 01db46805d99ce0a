from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from extproc.bench import routing
from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_envoy import POOL_HEADER
from extproc.bench.routing_report import series, write_reports
from extproc.sim.profile import load_profile


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    return parser.parse_args(["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *extra])


def test_every_option_has_help() -> None:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    assert all(action.help for action in parser._actions if action.dest != "help")


def test_plan_defaults_and_quick(tmp_path: Path) -> None:
    plan = routing._plan(_args(tmp_path))
    assert plan.strategies == ("envoy-round-robin", "envoy-least-request", "least-inflight", "default")
    assert len(plan.qps) == 3 and plan.duration_s == 25.0
    assert plan.kv_blocks == plan.sizing["auto_kv_blocks"]
    assert 2 <= plan.sizing["working_set_per_replica_capacity"]["chat"] <= 4
    assert plan.sizing["fleet_capacity_per_working_set"]["chat"] >= 1
    profile = load_profile(plan.sim_args[1])  # the file the simulator gets, based on h100-8b
    assert profile.num_gpu_blocks == plan.kv_blocks and profile.step_base_s == load_profile("h100-8b").step_base_s
    quick = routing._plan(_args(tmp_path, "--quick"))
    assert quick.qps == (plan.qps[1],) and quick.duration_s == 20.0
    assert routing._plan(_args(tmp_path, "--quick", "--qps", "5,9")).qps == (5.0,)
    assert routing._plan(_args(tmp_path, "--kv-blocks", "900")).kv_blocks == 900


def test_plan_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown strategies"):
        routing._plan(_args(tmp_path, "--strategies", "envoy-round-robin,nope"))
    with pytest.raises(ValueError, match="positive"):
        routing._plan(_args(tmp_path, "--qps", "0"))
    with pytest.raises(ValueError, match="two pools"):
        routing._plan(_args(tmp_path, "--workload", "mixed", "--endpoints", "1"))


async def test_overload_rejects_unknown_strategies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await routing.run_routing(_args(tmp_path, "--workload", "overload", "--strategies", "random")) == 2
    assert "strategies must be" in capsys.readouterr().err


def test_mixed_layout_has_two_pools_and_adapters() -> None:
    layout = routing.layout_for("mixed", 8)
    assert [(p.name, p.replicas, bool(p.lora)) for p in layout.pools] == [("chat", 4, True), ("code", 4, False)]
    models = {json.loads(layout.workload(0).next_spec(i).body)["model"] for i in range(200)}
    assert {routing.CHAT_MODEL, routing.CODE_MODEL, *routing.ADAPTERS} == models


def test_envoy_baselines_name_the_pool_in_a_header() -> None:
    spec = RequestSpec("POST", "/v1/chat/completions", (("a", "b"),), b"{}", labels={"pool": "code"})
    wrapped = routing._with_pool_header(lambda _: spec)(0)
    assert wrapped.headers == (("a", "b"), (POOL_HEADER, "code")) and wrapped.body == spec.body


def test_reports_are_written(tmp_path: Path) -> None:
    rows = [
        {"strategy": "default", "qps": 4.0, "ttft_p50_ms": 50.0, "ttft_p99_ms": 400.0, "hit_rate": 0.9,
         "saturated": []},
        {"strategy": "default", "qps": 8.0, "ttft_p50_ms": 60.0, "ttft_p99_ms": None, "hit_rate": 0.8,
         "saturated": ["sim"]},
        {"strategy": "random", "qps": 4.0, "failed": "ChildExited: boom"},
    ]
    assert series(rows, "ttft_p99_ms", " p99") == {"default p99": [(4.0, 400.0)]}
    meta = {"workload": "shared-prefix", "endpoints": 8, "service_replicas": 1, "warmup_s": 5.0, "duration_s": 25.0,
            "seed": 0, "isolation": "fresh stack", "wall_s": 1.0, "saturation_limit_cores": 0.9,
            "kv_sizing": {"rule": "r", "working_set_tokens": {"chat": 1}, "kv_blocks": 1, "auto_kv_blocks": 1,
                          "working_set_per_replica_capacity": {}, "fleet_capacity_per_working_set": {}}}
    paths = write_reports(tmp_path / "out", rows, [("strategy", "strategy"), ("qps", "qps"), ("hit_rate", "hit")],
                          meta)
    assert [p.name for p in paths] == ["results.json", "results.md", "ttft_vs_qps.png", "hit_rate_vs_qps.png"]
    assert json.loads(paths[0].read_text())["points"][2]["failed"] == "ChildExited: boom"
    text = paths[1].read_text()
    assert "| default | 8.00 | 0.80 |" in text and "random @ 4: ChildExited" in text and "default @ 8: sim" in text
    assert all(p.stat().st_size > 0 for p in paths[2:])
    assert yaml.safe_load(yaml.safe_dump(routing.sim_profile(700))) == {
        "base": "h100-8b", "name": "h100-8b-kv700", "num_gpu_blocks": 700}
