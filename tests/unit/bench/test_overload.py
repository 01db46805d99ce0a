from __future__ import annotations

import json

import pytest

from extproc.bench import overload
from extproc.bench.loadgen import Sample
from extproc.sim.profile import BUILTIN_PROFILES


def test_max_min_fair_shares_fill_light_demands_first() -> None:
    shares = overload.max_min_shares({"a": 10, "b": 10, "c": 40, "d": 80}, 100)
    assert shares == pytest.approx({"a": 10, "b": 10, "c": 40, "d": 40})
    assert overload.max_min_shares({"a": 50, "b": 50}, 40) == pytest.approx({"a": 20, "b": 20})


def test_jain_index() -> None:
    assert overload.jain([1, 1, 1, 1]) == pytest.approx(1.0)
    assert overload.jain([1, 1, 2, 4]) == pytest.approx(64 / (4 * 22))
    assert overload.jain([]) is None


def test_capacity_is_the_profiles_per_replica_capacity_times_replicas() -> None:
    profile = BUILTIN_PROFILES["h100-8b"]
    one = overload.capacity_rps(profile, 1, 100, 96)
    assert one == pytest.approx(profile.capacity_rps(100, 96))
    assert overload.capacity_rps(profile, 4, 100, 96) == pytest.approx(4 * one)


def _sample(index: int, tenant: str, klass: str, status: int = 200, ttft: float | None = 0.1) -> Sample:
    error = None if status < 400 else f"http_{status // 100}xx"
    return Sample(index, {"tenant": tenant, "class": klass}, 0.0, 0.0, status=status, error=error,
                  ttft_s=ttft if error is None else None, e2e_s=0.5)


def test_fairness_scores_served_against_the_fair_share() -> None:
    samples = [_sample(i, "std-1", "standard") for i in range(10)]
    samples += [_sample(100 + i, "std-2", "standard") for i in range(10)]
    # std-3 and std-4 asked for more; each got the same 20 served: perfectly fair.
    samples += [_sample(200 + i, "std-3", "standard", 200 if i < 20 else 503) for i in range(40)]
    samples += [_sample(300 + i, "std-4", "standard", 200 if i < 20 else 503) for i in range(80)]
    assert overload.fairness(samples, 30.0)["jain"] == pytest.approx(1.0)
    # Served in proportion to demand instead (first come, first served): unfair.
    unfair = [s for s in samples if s.labels["tenant"] in ("std-1", "std-2")]
    unfair += [_sample(400 + i, "std-3", "standard", 200 if i < 13 else 503) for i in range(40)]
    unfair += [_sample(500 + i, "std-4", "standard", 200 if i < 27 else 503) for i in range(80)]
    assert overload.fairness(unfair, 30.0)["jain"] < 0.95


def test_class_rows_count_rejections_and_slo() -> None:
    samples = [_sample(0, "crit", "critical", ttft=0.1), _sample(1, "crit", "critical", ttft=3.0),
               _sample(2, "batch", "sheddable", 503)]
    rows = overload.class_rows(samples, slo_s=2.0)
    assert rows["critical"]["served"] == 2 and rows["critical"]["within_slo"] == 1
    assert rows["sheddable"]["rejected"] == 1 and rows["sheddable"]["max_reject_s"] == 0.5


def test_specs_follow_the_mix_and_carry_tenant_headers() -> None:
    spec = overload._spec_factory(0, envoy_only=True)
    specs = [spec(i) for i in range(4000)]
    share = sum(1 for s in specs if s.labels["class"] == "sheddable") / len(specs)
    assert share == pytest.approx(0.35, abs=0.03)
    headers = dict(specs[0].headers)
    assert headers["x-tenant-tier"] in {"gold", "standard", "batch"} and "x-bench-pool" in headers
    assert json.loads(specs[0].body)["stream"] is True
    assert spec(7).body == overload._spec_factory(0, envoy_only=True)(7).body


def test_service_after_the_run_does_not_count() -> None:
    late = [Sample(i, {"tenant": "std-1", "class": "standard"}, 29.0, 0.0, status=200, ttft_s=5.0, e2e_s=6.0)
            for i in range(5)]
    assert overload.fairness(late, 30.0)["served"]["std-1"] == 0


def test_longest_waits_over_replicas() -> None:
    flows = [{"classes": {"critical": {"max_wait_s": 0.2}, "standard": {"max_wait_s": 9.9}}},
             {"classes": {"critical": {"max_wait_s": 0.5}}}, {}]
    assert overload.longest_waits(flows) == {"critical": 0.5, "standard": 9.9}


def test_the_share_suffixes_set_the_replicas_shared_scrapes() -> None:
    from extproc.config import parse_policy

    url = "redis://127.0.0.1:1/0"
    pools = [{"name": "chat", "model": "m", "endpoints": ["127.0.0.1:9"]}]
    own = parse_policy(json.dumps({**overload._policy(True, url, share=False), "pools": pools}), "p.yaml")
    plain = parse_policy(json.dumps({**overload._policy(True, url), "pools": pools}), "p.yaml")
    assert plain.scheduling.scrape.share and not own.scheduling.scrape.share


def test_fleet_sync_ms_sets_both_replica_exchanges_so_they_keep_one_timer() -> None:
    from extproc.config import parse_policy

    url = "redis://127.0.0.1:1/0"
    pools = [{"name": "chat", "model": "m", "endpoints": ["127.0.0.1:9"]}]
    slower = parse_policy(json.dumps({**overload._policy(True, url, 20, share=False), "pools": pools}), "p.yaml")
    assert (slower.flow_control.fleet_sync_ms, slower.scheduling.placement_sync_ms) == (20, 20)
    assert not slower.scheduling.scrape.share
    plain = parse_policy(json.dumps({**overload._policy(True, url), "pools": pools}), "p.yaml")
    assert (plain.flow_control.fleet_sync_ms, plain.scheduling.placement_sync_ms) == (10, 10)
