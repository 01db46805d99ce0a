from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from extproc.bench import routing, routing_plan
from extproc.bench.peers import PEERS, fallback_lines, find_binary, parse_samples, policy_check

VLLM_METRICS = """# HELP x
vllm_router_policy_decisions_total{policy="cache_aware",worker="http://127.0.0.1:1"} 7
vllm_router_policy_decisions_total{policy="cache_aware",worker="http://127.0.0.1:2"} 5
vllm_router_kv_routing_inputs_total{transport="http",result="render"} 24
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_hit"} 10
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_miss"} 2
"""


def test_parse_samples_reads_names_labels_and_values() -> None:
    samples = parse_samples(VLLM_METRICS + "bare_gauge 3\nbroken{a=\"b\"} notanumber\n")
    key = ("vllm_router_kv_routing_inputs_total", frozenset({("transport", "http"), ("result", "render")}))
    assert samples[key] == 24.0
    assert samples[("bare_gauge", frozenset())] == 3.0
    assert all(name != "broken" for name, _ in samples)


def test_policy_check_counts_only_the_run_and_flags_fallbacks() -> None:
    router = PEERS["vllm-router-cache-aware"]
    before = parse_samples(VLLM_METRICS)
    after = parse_samples(VLLM_METRICS.replace(" 7\n", " 13\n").replace(" 24\n", " 36\n")
                          .replace(" 10\n", " 16\n"))
    check = policy_check(router, before, after, served=6)
    assert check["ok"] and check["decisions"] == 6 and check["fallbacks"] == {}
    assert check["counters"]["vllm_router_kv_routing_inputs_total:render"] == 12
    # Fewer decisions than served requests: some other path routed them.
    assert not policy_check(router, before, after, served=7)["ok"]
    # Workers without /render: vllm-router routes with no token ids, counted as missing_tokens.
    fallback = after | parse_samples(
        'vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="missing_tokens"} 3\n'
        'vllm_router_kv_routing_inputs_total{transport="http",result="render_unavailable"} 6\n')
    check = policy_check(router, before, fallback, served=6)
    assert not check["ok"]
    assert check["fallbacks"] == {"vllm_router_prefix_routing_decisions_total:missing_tokens": 3,
                                  "vllm_router_kv_routing_inputs_total:render_unavailable": 6}


def test_smg_check_needs_cache_aware_selections() -> None:
    router = PEERS["sglang-cache-aware"]
    line = 'smg_worker_selection_total{{worker_type="regular",model="m",policy="{}"}} {}\n'
    assert policy_check(router, {}, parse_samples(line.format("cache_aware", 4)), served=4)["ok"]
    assert not policy_check(router, {}, parse_samples(line.format("random", 4)), served=4)["ok"]


def test_fallback_lines_find_the_debug_markers() -> None:
    log = "INFO fine\nDEBUG Warning: No tree found for model 'm', using random worker selection\nINFO ok\n"
    assert fallback_lines(PEERS["sglang-cache-aware"], log) == [log.splitlines()[1]]
    assert fallback_lines(PEERS["vllm-router-cache-aware"], log) == []


def test_every_peer_binds_loopback_only() -> None:
    for router in PEERS.values():
        argv = router.argv("/bin/x", 1000, 1001, ["http://127.0.0.1:9"], "info")
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
        assert argv[argv.index("--policy") + 1] == router.policy
    assert PEERS["sglang-cache-aware"].argv("smg", 1, 2, [], "info")[1] == "launch"


def test_find_binary_names_the_extra_when_missing() -> None:
    with pytest.raises(FileNotFoundError, match=r"\[bench\]"):
        find_binary("no-such-router-binary")


def test_plan_accepts_peers_on_one_pool_only(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    base = ["--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--strategies"]
    small = ["--prefix-tokens", "100", "--question-tokens", "10", "--qps", "1"]
    strategies = "sglang-cache-aware,vllm-router-power-of-two,default"
    plan = routing_plan.make_plan(parser.parse_args([*small, *base, strategies]))
    assert plan.strategies == ("sglang-cache-aware", "vllm-router-power-of-two", "default")
    assert routing_plan.make_plan(parser.parse_args([*small, *base, "sglang-cache-aware", "--workload", "mixed"]))
    with pytest.raises(ValueError, match="front one pool"):
        routing_plan.make_plan(parser.parse_args([*base, "vllm-router-cache-aware", "--workload", "mixed-models"]))


def test_power_of_two_evidence_needs_a_nonzero_load() -> None:
    evidence = PEERS["vllm-router-power-of-two"].evidence
    line = "INFO power_of_two.rs:82: Power-of-two selection: http://127.0.0.1:1={} vs http://127.0.0.1:2={} -> selected"
    assert re.search(evidence, line.format(0, 4)) and re.search(evidence, line.format(12, 0))
    assert not re.search(evidence, line.format(0, 0))
