from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import yaml

from extproc.bench import routing, routing_plan, stack
from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_envoy import AFFINITY_HEADER, POOL_HEADER
from extproc.bench.routing_pool import TTFTS, TTFTS_FILE, read_ttfts
from extproc.bench.routing_report import aggregate, series, write_reports
from extproc.bench.stack import Stack, build_policy
from extproc.config import parse_policy
from extproc.sim.profile import load_profile

SMALL = ("--groups", "8", "--prefix-tokens", "200", "--question-tokens", "20")  # cheap to measure


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    return parser.parse_args(["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *extra])


def test_every_option_has_help() -> None:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    assert all(action.help for action in parser._actions if action.dest != "help")


def test_plan_defaults_and_quick(tmp_path: Path) -> None:
    plan = routing_plan.make_plan(_args(tmp_path, *SMALL))
    assert plan.strategies == ("envoy-round-robin", "envoy-least-request", "default")
    capacity = plan.capacity["rps"]
    assert [load for _, load in plan.rates] == [0.4, 0.8] and plan.duration_s == 25.0 and plan.seeds == (0,)
    assert plan.rates[1][0] == pytest.approx(0.8 * capacity, abs=0.01)
    assert plan.kv_blocks == plan.sizing["auto_kv_blocks"] and plan.slo_ttft_s == 0.5
    assert plan.sizing["fleet_capacity_per_working_set"]["chat"] >= 1
    profile = load_profile(plan.sim_args(3)[1])  # the file the simulator gets, based on h100-8b
    assert profile.num_gpu_blocks == plan.kv_blocks and profile.step_base_s == load_profile("h100-8b").step_base_s
    assert plan.sim_args(3)[-2:] == ("--seed", "3")
    quick = routing_plan.make_plan(_args(tmp_path, *SMALL, "--quick"))
    assert quick.rates == (plan.rates[1],) and quick.duration_s == 20.0
    assert routing_plan.make_plan(_args(tmp_path, *SMALL, "--quick", "--qps", "5,9")).rates == ((5.0, None),)
    assert routing_plan.make_plan(_args(tmp_path, *SMALL, "--kv-blocks", "900")).kv_blocks == 900
    repeated = routing_plan.make_plan(_args(tmp_path, *SMALL, "--repeat", "3", "--seed", "4", "--replicas", "2",
                                            "--strategies", "default,default@3"))
    assert repeated.seeds == (4, 5, 6)
    assert [repeated.service_replicas(s) for s in repeated.strategies] == [2, 3]
    assert plan.isolate is None  # --isolate off by default: every process shares every CPU
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) >= 2:
        split = routing_plan.make_plan(_args(tmp_path, *SMALL, "--isolate", str(usable[0]))).isolate
        assert split is not None and split.system == {usable[0]} and split.harness == set(usable[1:])
    with pytest.raises(ValueError, match="leaves no CPU for the harness"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--isolate", ",".join(map(str, usable))))


def test_every_strategy_of_a_seed_runs_on_the_same_engine_ports(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The prefix scorer's tie-break hashes endpoint addresses: new ports per point placed cold prompts anew.
    bases = iter(range(20_000, 30_000, 100))
    monkeypatch.setattr(stack, "free_port_block", lambda count: next(bases))
    monkeypatch.setattr(stack, "_all_free", lambda ports: True)
    plan = routing_plan.make_plan(_args(tmp_path, *SMALL, "--repeat", "2", "--endpoints", "4"))
    assert plan.engine_ports(0) == [20_000, 20_001, 20_002, 20_003] == plan.engine_ports(0)
    assert plan.engine_ports(1) == [20_100, 20_101, 20_102, 20_103] == plan.engine_ports(1)
    monkeypatch.setattr(stack, "_all_free", lambda ports: 20_001 not in ports)  # taken meanwhile: new ones
    assert plan.engine_ports(0) == [20_200, 20_201, 20_202, 20_203]


def test_drift_moves_halfway_through_the_measured_run(tmp_path: Path) -> None:
    plan = routing_plan.make_plan(_args(tmp_path, *SMALL, "--workload", "drift", "--qps", "10"))
    workload = plan.workload_for(0, 10.0)  # 5 s warm-up + half of 25 s at 10 req/s: request 175
    assert [workload.next_spec(i).labels["phase"] for i in (174, 175)] == ["before", "after"]


def test_plan_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown strategies"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "envoy-round-robin,nope"))
    with pytest.raises(ValueError, match="unknown strategies"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "envoy-round-robin@3"))
    for bad in ("envoy-round-robin+lean", "default+fast", "sglang-cache-aware+noflow",
                "envoy-round-robin+streamed"):  # suffixes: our profiles
        with pytest.raises(ValueError, match="unknown strategies"):
            routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", bad))
    assert routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "default+noflow+lean@2")).strategies
    with pytest.raises(ValueError, match="@N"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "default@0"))
    with pytest.raises(ValueError, match="exclude each other"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "default+streamed+buffered"))
    with pytest.raises(ValueError, match="exclude each other"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--strategies", "default+lean+grpcio"))
    with pytest.raises(ValueError, match="positive"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "0"))
    with pytest.raises(ValueError, match="not both"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "1", "--loads", "0.5"))
    with pytest.raises(ValueError, match="two pools"):
        routing_plan.make_plan(_args(tmp_path, "--workload", "mixed-models", "--endpoints", "1"))


VARIANT = {
    "plugins": [{"name": "v-prefix", "type": "prefix-affinity-scorer", "parameters": {"hot_hold_ms": 0}},
                {"name": "v-pick", "type": "max-score-picker"}],
    "profiles": [{"name": "variant", "plugins": [{"pluginRef": "v-prefix", "weight": 3}, {"pluginRef": "v-pick"}]}],
}


def test_a_scheduling_file_adds_profiles_to_run_as_strategies(tmp_path: Path) -> None:
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(VARIANT))
    plan = routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "5", "--scheduling", str(path),
                                        "--strategies", "default,variant,variant+noflow@2"))
    assert plan.strategies == ("default", "variant", "variant+noflow@2") and plan.scheduling == VARIANT
    pools = plan.layout.pools
    document = build_policy(pools, {pools[0].name: [9001, 9002]}, [9100, 9101, 9102, 9103],
                            extra={"scheduling": plan.scheduling})  # as stack.prepare writes it (no ports taken)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(document))
    stack = Stack(tmp_path, parse_policy(policy_path.read_text(), str(policy_path)), policy_path,
                  tmp_path / "envoy", {pools[0].name: [9001, 9002]}, [(9100, 9101)])
    routing._use_profile(stack, plan.layout.pools, "variant+noflow")
    assert {p.profile for p in stack.policy.pools} == {"variant"} and not stack.policy.flow_control.enabled
    assert stack.policy.scheduling.scrape.share and not stack.policy.scheduling.scrape.stagger  # the defaults
    assert stack.policy.service.front_end == "lean"  # the policy's default without a front-end suffix
    routing._use_profile(stack, plan.layout.pools, "variant+noshare+noflow+stagger")
    assert not stack.policy.scheduling.scrape.share and not stack.policy.flow_control.enabled
    assert stack.policy.scheduling.scrape.stagger
    assert stack.policy.scheduling.plugins[0].parameters == {"hot_hold_ms": 0}
    assert stack.policy.envoy.request_body_mode == "prebuffered"  # the policy's default without a body-mode suffix
    routing._use_profile(stack, plan.layout.pools, "variant+streamed")
    assert stack.policy.envoy.request_body_mode == "streamed" and stack.policy.flow_control.enabled
    assert stack.policy.scheduling.scrape.share  # back to the default after +noshare
    assert stack.policy.scheduling.push_requests
    routing._use_profile(stack, plan.layout.pools, "variant+nopush@3")
    assert not stack.policy.scheduling.push_requests
    lds = yaml.safe_load((tmp_path / "envoy" / "lds.yaml").read_text())  # what Envoy loads for this strategy
    ext_proc = lds["resources"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][1]
    assert ext_proc["name"] == "envoy.filters.http.ext_proc"  # no buffer filter ahead of it
    assert ext_proc["typed_config"]["send_body_without_waiting_for_header_response"] is True
    assert ext_proc["typed_config"]["processing_mode"]["request_body_mode"] == "STREAMED"
    routing._use_profile(stack, plan.layout.pools, "variant+buffered+grpcio")
    assert stack.policy.envoy.request_body_mode == "buffered" and stack.policy.service.front_end == "grpcio"
    with pytest.raises(ValueError, match="unknown strategies"):  # without the file, the profile is unknown
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "5", "--strategies", "variant"))
    broken = {**VARIANT, "profiles": [{"name": "variant", "plugins": [{"pluginRef": "saturation"}]}]}
    path.write_text(yaml.safe_dump(broken))  # a policy's profile may not name a built-in plugin
    with pytest.raises(ValueError, match="unknown plugin"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "5", "--scheduling", str(path)))
    path.write_text(yaml.safe_dump({**VARIANT, "scrape": {}}))
    with pytest.raises(ValueError, match="plugins: and profiles: only"):
        routing_plan.make_plan(_args(tmp_path, *SMALL, "--qps", "5", "--scheduling", str(path)))


@pytest.mark.parametrize("strategy", ["random", "default+lean", "default+bogus", "default+share@3"])
async def test_overload_rejects_unknown_strategies(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   strategy: str) -> None:
    assert await routing.run_routing(_args(tmp_path, "--workload", "overload", "--strategies", strategy)) == 2
    assert "strategies must be" in capsys.readouterr().err


def test_mixed_layouts() -> None:
    layout = routing_plan.layout_for("mixed-models", 8)
    assert [(p.name, p.replicas, bool(p.lora)) for p in layout.pools] == [("chat", 4, True), ("code", 4, False)]
    models = {json.loads(layout.workload(0, None).next_spec(i).body)["model"] for i in range(200)}
    assert {routing_plan.CHAT_MODEL, routing_plan.CODE_MODEL, *routing_plan.ADAPTERS} == models
    one = routing_plan.layout_for("mixed", 8)
    assert [(p.name, p.replicas, p.lora) for p in one.pools] == [("chat", 8, ())]
    kinds = {one.workload(0, None).next_spec(i).labels["kind"] for i in range(200)}
    assert kinds == {"long", "unique", "short"}


def test_envoy_baselines_name_the_pool_and_the_prompt_group_in_headers() -> None:
    spec = RequestSpec("POST", "/v1/chat/completions", (("a", "b"),), b"{}", labels={"pool": "code"})
    wrapped = routing._with_pool_header(lambda _: spec)(4)
    assert wrapped.headers == (("a", "b"), (POOL_HEADER, "code"), (AFFINITY_HEADER, "request-4"))
    assert wrapped.body == spec.body
    grouped = RequestSpec("POST", "/", labels={"pool": "chat", "model": "m", "group": "7"})
    assert dict(routing._with_pool_header(lambda _: grouped)(5).headers)[AFFINITY_HEADER] == "m/7"
    talk = RequestSpec("POST", "/", labels={"pool": "chat", "model": "m", "conversation": "3", "group": "1"})
    assert dict(routing._with_pool_header(lambda _: talk)(6).headers)[AFFINITY_HEADER] == "m/3"


def test_reports_are_written(tmp_path: Path) -> None:
    def row(seed: int, p90: float, hit: float, **extra: object) -> dict[str, object]:
        return {"strategy": "default", "qps": 4.0, "load": 0.4, "seed": seed, "ok": 100, "errors": 0,
                "ttft_p50_ms": 30.0, "ttft_p90_ms": p90, "ttft_p99_ms": p90 * 2, "hit_rate": hit, "saturated": [],
                "cores": {"sim": 0.2, "service": 0.1}, "max_cores": 0.2, TTFTS: [30.0, p90, p90 * 2],
                "cache": {"hit_tokens": hit * 100, "query_tokens": 100}, **extra}

    rows = [row(0, 50.0, 0.9, service_loop_lag={"max_ms": 12.5}), row(1, 70.0, 0.8, errors=2,
                                                                     service_loop_lag={"max_ms": 101.0}),
            row(2, 60.0, 0.85, saturated=["sim"]),
            {"strategy": "random", "qps": 4.0, "load": 0.4, "seed": 0, "failed": "ChildExited: boom"}]
    merged = aggregate(rows)
    assert len(merged) == 1 and merged[0]["seeds"] == 3 and merged[0]["ttft_p90_ms"] == 60.0
    assert merged[0]["ttft_p90_ms_range"] == "50-70" and merged[0]["hit_rate"] == 0.85
    assert merged[0]["errors"] == 2 and merged[0]["saturated"] == ["sim"]
    assert merged[0]["lag_max_ms"] == 101.0  # the worst seed's longest stall of the service's loop
    assert merged[0]["pooled"] == {"requests": 9, "hit_rate": 0.85, "ttft_p50_ms": 60.0, "ttft_p90_ms": 124.0,
                                   "ttft_p99_ms": 138.4}  # over the 9 requests of the 3 seeds
    assert series(merged, "ttft_p99_ms", " p99") == {"default p99": [(0.4, 120.0)]}
    assert series(merged, "pooled.ttft_p99_ms") == {"default": [(0.4, 138.4)]}
    meta = {"workload": "shared-prefix", "endpoints": 8, "service_replicas": 1, "warmup_s": 5.0, "duration_s": 25.0,
            "seeds": [0, 1, 2], "isolation": "fresh stack", "wall_s": 1.0, "saturation_limit_cores": 0.9,
            "slo_ttft_s": 0.5, "command": "extproc bench routing --repeat 3",
            "capacity": {"rps": 10.0, "rule": "r", "pools": {"chat": {"share": 1.0}}},
            "kv_sizing": {"rule": "r", "working_set_tokens": {"chat": 1}, "kv_blocks": 1, "auto_kv_blocks": 1,
                          "working_set_per_replica_capacity": {}, "fleet_capacity_per_working_set": {}}}
    paths = write_reports(tmp_path / "out", rows, meta)
    assert [p.name for p in paths] == ["results.json", "results.md", TTFTS_FILE, "ttft_vs_load.png",
                                       "hit_rate_vs_load.png"]
    report = json.loads(paths[0].read_text())
    assert report["points"][3]["failed"] == "ChildExited: boom" and report["summary"][0]["seeds"] == 3
    assert not any(TTFTS in p for p in report["points"])  # the TTFTs go to their own file, for pooling again
    assert read_ttfts(paths[2])["default-q4-s1"] == [30.0, 70.0, 140.0]
    text = paths[1].read_text()
    assert "| default | 0.40 | 4.00 | 3 |" in text and "random @ 4, seed 0: ChildExited" in text
    assert "default @ 4: sim" in text and "`extproc bench routing --repeat 3`" in text
    assert "| strategy | load | service | sim |" in text  # CPU per process
    # pooled hit, its median, range; pooled p50, pooled p90, its median, range; pooled p99, its median, range
    assert "| 0.85 | 0.85 | 0.8-0.9 | 60.00 | 124.00 | 60.00 | 50-70 | 138.40 | 120.00 | 100-140 |" in text
    assert all(p.stat().st_size > 0 for p in paths[3:])
    assert yaml.safe_load(yaml.safe_dump(routing_plan.sim_profile(700))) == {
        "base": "h100-8b", "name": "h100-8b-kv700", "num_gpu_blocks": 700}
