from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.config import parse_policy
from extproc.rollout.envoy_sync import (
    FallbackRoute,
    FallbackRouteWriter,
    integer_weights,
    render_fallback_route,
    sync_fallback_route,
)
from extproc.xds.render import route_config

POLICY = """\
pools:
  - {name: v1, model: m/chat, endpoints: ["127.0.0.1:8001"]}
  - {name: v2, model: m/chat-next, endpoints: ["127.0.0.1:8002"]}
  - {name: emb, model: m/emb, endpoints: ["127.0.0.1:8003"]}
"""


def base() -> dict[str, Any]:
    return route_config(parse_policy(POLICY))


def routes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = config["virtual_hosts"][0]["routes"]
    return routes


@pytest.mark.parametrize(("weights", "total", "expected"), [
    ({"v1": 0.95, "v2": 0.05}, 100, {"v1": 95, "v2": 5}),
    ({"a": 1, "b": 1, "c": 1}, 100, {"a": 34, "b": 33, "c": 33}),
    ({"v1": 1.0, "v2": 0.0}, 100, {"v1": 100}),
    ({"v1": 0.999, "v2": 0.001}, 100, {"v1": 100}),
    ({"v1": 0.999, "v2": 0.001}, 10_000, {"v1": 9990, "v2": 10}),
])
def test_integer_weights_sum_exactly(weights: dict[str, float], total: int, expected: dict[str, int]) -> None:
    result = integer_weights(weights, total)
    assert result == expected and sum(result.values()) == total


def test_integer_weights_need_a_positive_weight() -> None:
    with pytest.raises(ValueError):
        integer_weights({"a": 0.0})


def test_fallback_routes_follow_the_main_route() -> None:
    rendered = render_fallback_route(
        base(), cluster_header="x-gateway-pool", default_model="chat",
        routes=[FallbackRoute("chat", {"v1": 0.75, "v2": 0.25}), FallbackRoute("emb", {"emb": 1.0})])
    main, chat, emb, catch_all = routes_of(rendered)
    assert main["match"]["headers"] == [{"name": "x-gateway-pool", "present_match": True}]
    assert main["route"]["cluster_header"] == "x-gateway-pool"
    assert chat["match"] == {"prefix": "/", "headers": [{"name": "x-gateway-model",
                                                         "string_match": {"exact": "chat"}}]}
    assert chat["route"]["weighted_clusters"] == {"clusters": [{"name": "v1", "weight": 75},
                                                               {"name": "v2", "weight": 25}]}
    # Same timeouts and retry policy as the main route, no cluster_header.
    assert "cluster_header" not in chat["route"]
    assert chat["route"]["retry_policy"] == main["route"]["retry_policy"]
    assert chat["route"]["timeout"] == main["route"]["timeout"]
    assert emb["route"]["weighted_clusters"]["clusters"] == [{"name": "emb", "weight": 100}]
    assert catch_all["match"] == {"prefix": "/"}
    assert catch_all["route"]["weighted_clusters"] == chat["route"]["weighted_clusters"]
    assert len(routes_of(base())) == 2  # input untouched: pool route and the unrouted (fail-closed) route


def test_without_a_default_the_previous_catch_all_stays_last() -> None:
    plain = render_fallback_route(base(), cluster_header="x-gateway-pool",
                                  routes=[FallbackRoute("chat", {"v1": 1.0})])
    assert routes_of(plain)[-1] == base()["virtual_hosts"][0]["routes"][1]  # the rendered unrouted route
    # A base that already falls back to one pool (envoy.fallback_pool) keeps that catch-all last.
    with_pool = base()
    routes_of(with_pool)[1] = {"match": {"prefix": "/"}, "route": {"cluster": "emb", "timeout": "600s"}}
    rendered = routes_of(render_fallback_route(with_pool, cluster_header="x-gateway-pool",
                                               routes=[FallbackRoute("chat", {"v1": 1.0})]))
    assert len(rendered) == 3 and rendered[-1]["route"]["cluster"] == "emb"
    assert rendered[0]["match"]["headers"] == [{"name": "x-gateway-pool", "present_match": True}]


def test_no_model_header_means_only_the_default_catch_all() -> None:
    rendered = render_fallback_route(base(), cluster_header="x-gateway-pool", model_header=None,
                                     default_model="chat", routes=[FallbackRoute("chat", {"v1": 0.5, "v2": 0.5})])
    assert len(routes_of(rendered)) == 2


def test_base_without_a_cluster_header_route_is_an_error() -> None:
    with pytest.raises(ValueError, match="cluster_header"):
        render_fallback_route(base(), cluster_header="x-other", routes=[])


def test_sync_writes_atomically_and_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "rds.yaml"
    one = render_fallback_route(base(), cluster_header="x-gateway-pool",
                                routes=[FallbackRoute("chat", {"v1": 0.95, "v2": 0.05})])
    assert sync_fallback_route(path, one)
    inode = os.stat(path).st_ino
    assert not sync_fallback_route(path, one)
    assert os.stat(path).st_ino == inode
    two = render_fallback_route(base(), cluster_header="x-gateway-pool",
                                routes=[FallbackRoute("chat", {"v1": 0.75, "v2": 0.25})])
    assert sync_fallback_route(path, two)
    assert os.stat(path).st_ino != inode  # replaced by rename, never rewritten in place
    document = yaml.safe_load(path.read_text())
    assert document["resources"][0]["name"] == "llm_routes"
    assert routes_of(document["resources"][0])[1]["route"]["weighted_clusters"]["clusters"][1] == {
        "name": "v2", "weight": 25}
    assert [p.name for p in tmp_path.iterdir()] == ["rds.yaml"]  # no temporary left behind


async def test_writer_is_a_rollouts_weights_listener(tmp_path: Path) -> None:
    writer = FallbackRouteWriter(tmp_path / "rds.yaml", base(), cluster_header="x-gateway-pool",
                                 default_model="chat")
    await writer({"chat": {"v1": 0.95, "v2": 0.05}, "emb": {"emb": 1.0}})
    await writer({"chat": {"v1": 0.95, "v2": 0.05}, "emb": {"emb": 1.0}})
    assert writer.writes == 1
    await writer({"chat": {"v1": 0.0, "v2": 1.0}, "emb": {"emb": 1.0}})
    assert writer.writes == 2
    routes = routes_of(yaml.safe_load((tmp_path / "rds.yaml").read_text())["resources"][0])
    assert routes[-1]["route"]["weighted_clusters"]["clusters"] == [{"name": "v2", "weight": 100}]
