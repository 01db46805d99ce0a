from __future__ import annotations

import argparse

import pytest

from extproc.bench.routing_options import (
    BUFFERED,
    ENVOY2,
    GRPCIO,
    LEAN,
    NOFLOW,
    NOSHARE,
    PREBUFFERED,
    SHARE,
    STAGGER,
    STREAMED,
    PrefixShape,
    add_shape_options,
    body_mode,
    envoy_workers,
    front_end,
    parse_range,
    service_replicas,
    shares_scrapes,
    split_strategy,
    staggers_scrapes,
)
from extproc.bench.routing_workloads import popularity_weights, shared_prefix_workload


def test_strategies_run_flow_control_as_shipped_unless_told_not_to() -> None:
    assert split_strategy("default") == ("default", True)
    assert split_strategy(f"load-only{NOFLOW}") == ("load-only", False)
    assert split_strategy(f"default{NOFLOW}@3") == ("default", False) and split_strategy("default@3")[1]
    assert service_replicas("default@3", 1) == 3 and service_replicas("default", 2) == 2
    for bad in ("default@0", "default@x", "default@17"):
        with pytest.raises(ValueError):
            service_replicas(bad, 1)


def test_front_end_suffixes_override_the_policy_and_combine_with_the_others() -> None:
    # No suffix: the policy's default front end (as a new user gets it), not one the bench picks.
    assert front_end("default") is None and front_end(f"default{NOFLOW}@3") is None
    for strategy in (f"default{LEAN}", f"default{NOFLOW}{LEAN}@3", f"default{LEAN}{NOFLOW}"):
        assert front_end(strategy) == "lean"
        assert split_strategy(strategy)[0] == "default"
    assert front_end(f"default{GRPCIO}{STREAMED}@2") == "grpcio"
    assert split_strategy(f"default{GRPCIO}{NOFLOW}") == ("default", False)
    with pytest.raises(ValueError, match="exclude each other"):
        front_end(f"default{LEAN}{GRPCIO}")
    assert split_strategy(f"default{LEAN}@3") == ("default", True)
    assert split_strategy(f"default{LEAN}{NOFLOW}") == ("default", False)




def test_body_mode_suffixes_override_the_policy_and_exclude_each_other() -> None:
    assert body_mode("default") is None and body_mode(f"default{LEAN}{NOFLOW}@3") is None
    assert body_mode(f"default{STREAMED}") == "streamed" and body_mode(f"default{LEAN}{STREAMED}@2") == "streamed"
    assert body_mode(f"default{BUFFERED}{NOFLOW}") == "buffered"
    assert body_mode(f"default{PREBUFFERED}@2") == "prebuffered"
    assert split_strategy(f"default{STREAMED}{NOFLOW}") == ("default", False)
    with pytest.raises(ValueError, match="exclude each other"):
        body_mode(f"default{STREAMED}{BUFFERED}")
    with pytest.raises(ValueError, match="exclude"):
        body_mode(f"default{PREBUFFERED}{BUFFERED}")


def test_the_share_suffixes_set_shared_scrapes_and_combine_with_the_others() -> None:
    assert shares_scrapes("default") is None and shares_scrapes(f"default{NOFLOW}{LEAN}@3") is None
    for strategy in (f"default{SHARE}", f"default{NOFLOW}{SHARE}@3", f"default{SHARE}{LEAN}"):
        assert shares_scrapes(strategy) is True and split_strategy(strategy)[0] == "default"
    assert shares_scrapes(f"default{NOSHARE}@3") is False and shares_scrapes(f"default{NOFLOW}{NOSHARE}") is False
    with pytest.raises(ValueError, match="exclude each other"):
        shares_scrapes(f"default{SHARE}{NOSHARE}")
    assert split_strategy(f"default{SHARE}{NOFLOW}") == ("default", False)
    assert front_end(f"default{SHARE}{LEAN}") == "lean"


def test_the_stagger_and_envoy_worker_suffixes_combine_with_the_others() -> None:
    assert not staggers_scrapes("default") and envoy_workers("default@3") == 1
    strategy = f"default{STAGGER}{ENVOY2}{NOFLOW}@2"
    assert staggers_scrapes(strategy) and envoy_workers(strategy) == 2
    assert split_strategy(strategy) == ("default", False) and service_replicas(strategy, 1) == 2


@pytest.mark.parametrize(("text", "bounds"), [("300", (300, 300)), ("8-48", (8, 48))])
def test_ranges(text: str, bounds: tuple[int, int]) -> None:
    assert parse_range(text) == bounds


@pytest.mark.parametrize("text", ["0", "9-3", "x", "3-"])
def test_bad_ranges(text: str) -> None:
    with pytest.raises(ValueError):
        parse_range(text)


def test_zipf_popularity_favours_the_first_groups() -> None:
    weights = popularity_weights("zipf:1.1", 48)
    assert weights[0] == 1.0 and weights[1] == pytest.approx(2 ** -1.1) and weights[47] < weights[10]
    assert popularity_weights("uniform", 3) == [1.0, 1.0, 1.0]
    for bad in ("zipf", "zipf:-1", "pareto:2"):
        with pytest.raises(ValueError):
            popularity_weights(bad, 3)


def test_zipf_workload_asks_the_hot_group_most_and_exact_outputs_ignore_eos() -> None:
    workload = shared_prefix_workload("m", groups=48, prefix_tokens=(50, 50), question_tokens=(5, 5),
                                      max_tokens=(100, 100), popularity="zipf:1.1")
    groups = [workload.next_spec(i).labels["group"] for i in range(2000)]
    assert groups.count("0") > 5 * groups.count("20") > 0
    assert b'"ignore_eos": true' in workload.next_spec(0).body


def test_shape_from_args() -> None:
    parser = argparse.ArgumentParser()
    add_shape_options(parser)
    parser.add_argument("--workload", default="shared-prefix")
    args = parser.parse_args(["--groups", "48", "--prefix-tokens", "3000", "--question-tokens", "300",
                              "--output-tokens", "100", "--popularity", "zipf:1.1"])
    shape = PrefixShape.from_args(args)
    assert shape == PrefixShape(48, (3000, 3000), (300, 300), (100, 100), "zipf:1.1")
    assert PrefixShape.from_args(parser.parse_args([])) == PrefixShape()  # the shape, uniform
    assert PrefixShape.from_args(parser.parse_args(["--workload", "drift"])).popularity == "zipf:1.1"
    with pytest.raises(ValueError, match="hot set"):
        PrefixShape.from_args(parser.parse_args(["--workload", "drift", "--popularity", "uniform"]))
    with pytest.raises(ValueError):
        PrefixShape.from_args(parser.parse_args(["--popularity", "zipf"]))
