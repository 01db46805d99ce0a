"""A broken route file (RDS) dropped into the directory Envoy watches: Envoy rejects it and keeps serving.

A valid change is applied first (so the watch demonstrably works); then invalid weights and invalid
content each raise `update_rejected` while requests keep succeeding on the last good route.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from extproc.xds.render import write_atomic
from tests.chaos.conftest import assert_no_leaked_in_flight, chat_body, launch_stack
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAIN = SimPool("main", "org/main", 2, aliases=("main",))
MARK = "x-chaos-route"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("xds")
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [MAIN])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def rds_stats(http: aiohttp.ClientSession, stack: Stack) -> dict[str, int]:
    async with http.get(f"{stack.envoy_admin_url}/stats?filter=rds") as response:
        text = await response.text()
    stats = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if name.startswith("http.llm.rds.llm_routes.") and value.strip().isdigit():
            stats[name.rsplit(".", 1)[1]] = int(value)
    return stats


def refused(stats: dict[str, int]) -> int:
    """Updates Envoy did not apply: `update_rejected` (invalid config) + `update_failure` (unparsable file)."""
    return stats.get("update_rejected", 0) + stats.get("update_failure", 0)


async def wait_stats(http: aiohttp.ClientSession, stack: Stack, value: Callable[[dict[str, int]], int],
                     above: int) -> dict[str, int]:
    async def went_above() -> dict[str, int]:
        stats = await rds_stats(http, stack)
        assert value(stats) > above, stats
        return stats

    return await eventually(went_above, f"Envoy's {value.__name__} above {above}")


def successes(stats: dict[str, int]) -> int:
    return stats.get("update_success", 0)


async def served(http: aiohttp.ClientSession, stack: Stack, count: int = 10) -> list[tuple[int, str | None]]:
    results = []
    for i in range(count):
        body = chat_body("main", f"route check {i}")
        async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=body) as response:
            await response.read()
            results.append((response.status, response.headers.get(MARK)))
    return results


def with_marker(document: dict[str, Any], value: str) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    route = changed["resources"][0]["virtual_hosts"][0]["routes"][0]
    route["response_headers_to_add"] = [*route.get("response_headers_to_add", []), {
        "header": {"key": MARK, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    return changed


def bad_weights(document: dict[str, Any]) -> str:
    broken = with_marker(document, "bad-weights")
    action = broken["resources"][0]["virtual_hosts"][0]["routes"][0]["route"]
    del action["cluster_header"]
    action["weighted_clusters"] = {"clusters": [{"name": "main", "weight": -5}, {"name": "main", "weight": 0}]}
    return yaml.safe_dump(broken, sort_keys=False)


def zero_weights(document: dict[str, Any]) -> str:
    broken = with_marker(document, "zero-weights")
    action = broken["resources"][0]["virtual_hosts"][0]["routes"][0]["route"]
    del action["cluster_header"]
    action["weighted_clusters"] = {"clusters": [{"name": "main", "weight": 0}]}
    return yaml.safe_dump(broken, sort_keys=False)


def duplicate_domains(document: dict[str, Any]) -> str:
    broken = with_marker(document, "duplicate-domains")
    hosts = broken["resources"][0]["virtual_hosts"]
    hosts.append({**copy.deepcopy(hosts[0]), "name": "llm-again"})  # a second virtual host for "*"
    return yaml.safe_dump(broken, sort_keys=False)


def not_yaml(document: dict[str, Any]) -> str:
    return "resources: [ {'@type': type.googleapis.com/envoy.config.route.v3.RouteConfiguration, name: llm_"


# Envoy counts a file it cannot parse into the proto as update_failure, a parsed but invalid route
# configuration as update_rejected; neither is applied.
@pytest.mark.parametrize(("breakage", "counter"), [
    (bad_weights, "update_failure"),  # a negative weight is not a uint32
    (zero_weights, "update_rejected"),  # weights must sum to more than 0
    (duplicate_domains, "update_rejected"),
    (not_yaml, "update_failure"),
], ids=["bad_weights", "zero_weights", "duplicate_domains", "not_yaml"])
async def test_broken_rds_file_is_rejected_and_the_previous_route_keeps_serving(
        stack: Stack, http: aiohttp.ClientSession, breakage: Callable[[dict[str, Any]], str], counter: str) -> None:
    rds = stack.envoy_dir / "rds.yaml"
    original = yaml.safe_load(rds.read_text())
    before = await rds_stats(http, stack)
    # A valid change first: the watched file is live (the marker header appears on responses).
    good = f"good-{breakage.__name__}"
    write_atomic(rds, yaml.safe_dump(with_marker(original, good), sort_keys=False))
    await wait_stats(http, stack, successes, successes(before))
    assert await served(http, stack, 3) == [(200, good)] * 3
    try:
        applied = await rds_stats(http, stack)
        write_atomic(rds, breakage(original))
        after = await wait_stats(http, stack, refused, refused(applied))
        assert successes(after) == successes(applied)
        assert after.get(counter, 0) == applied.get(counter, 0) + 1, (counter, applied, after)
        # Still the last good route: every request succeeds and carries its marker.
        assert await served(http, stack) == [(200, good)] * 10
    finally:
        write_atomic(rds, yaml.safe_dump(original, sort_keys=False))
    await assert_no_leaked_in_flight(http, [stack.admin_url])
