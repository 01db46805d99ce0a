"""Our service as the endpoint picker of the two gateway shapes the Inference Extension runs on (extproc/xds/picker.py),
through real Envoy to a simulated vLLM fleet:

- Istio's InferencePool shape: ext_proc with FULL_DUPLEX_STREAMED bodies, metadata namespaces limited to `envoy.lb`,
  `override_host` reading the pick from `envoy.lb` metadata and reporting the served host there;
- Envoy AI Gateway's shape: an ORIGINAL_DST cluster routing by the `x-gateway-destination-endpoint` header (one
  `ip:port`: `endpoint_picker.single_endpoint`), TLS to the picker.

Through each: the pick is where Envoy sends the request, prefix affinity keeps a shared prompt on one endpoint,
limits answer 429, flow control sheds with 429, and a pool without a ready endpoint answers 503.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, free_ports, start_envoy, start_service, start_sim
from extproc.config import parse_policy
from extproc.xds.picker import Shape, picker_bootstrap
from extproc.xds.render import dump
from tests.support import eventually

pytestmark = pytest.mark.asyncio

POOL = SimPool("chat", "org/chat", 3, aliases=("chat",), max_num_seqs=1)
SUBSET_HEADER = "x-test-subset"  # what the test's gateway turns into the envoy.lb.subset_hint metadata


async def until(check: Callable[[], object], what: str) -> None:
    await eventually(check, what, timeout_s=15.0)  # a bound for a loaded machine


def stack_for(tmp_path: Path, shape: Shape, front_end: str) -> tuple[Stack, dict[str, Any]]:
    """Ports, policy and the shape's Envoy bootstrap; auth by trusted headers so each request names its tier."""
    grpc_port, admin_port, listen_port, envoy_admin, *sim = free_ports(4 + POOL.replicas)
    workdir = tmp_path
    document: dict[str, Any] = {
        "mode": "endpoint-picker",
        "endpoint_picker": {"single_endpoint": shape == "ai-gateway"},
        "service": {"grpc_port": grpc_port, "admin_port": admin_port, "front_end": front_end},
        "envoy": {"listen_port": listen_port, "admin_port": envoy_admin, "request_body_mode": "full-duplex"},
        "auth": {"mode": "trusted-header"},
        "tiers": {"default": {}, "limited": {"limits": {"requests_per_s": 0.01, "burst": 1}},
                  "sheddable": {"priority": "sheddable"}},
        # One seat per engine: a standard request fills it (no reserve), a sheddable one may use half of it.
        "flow_control": {"classes": {"standard": {"priority": 50, "max_wait_s": 10, "reserve": 0},
                                     "sheddable": {"priority": 0, "max_wait_s": 0, "reserve": 0.5}}},
        "pools": [{"name": "chat", "model": POOL.model, "aliases": list(POOL.aliases), "max_num_seqs": 1,
                   "endpoints": [f"127.0.0.1:{port}" for port in sim]}],
    }
    if shape == "ai-gateway":
        ca = trustme.CA()
        issued = ca.issue_cert("127.0.0.1", "endpoint-picker.llm")
        issued.cert_chain_pems[0].write_to_path(str(workdir / "tls.crt"))
        issued.private_key_pem.write_to_path(str(workdir / "tls.key"))
        document["service"]["tls"] = {"cert_file": str(workdir / "tls.crt"), "key_file": str(workdir / "tls.key")}
    policy_path = workdir / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(document))
    policy = parse_policy(policy_path.read_text(), str(policy_path))
    envoy_dir = workdir / "envoy"
    envoy_dir.mkdir()
    endpoints = policy.pools[0].endpoints
    bootstrap = picker_bootstrap(policy, shape, ("127.0.0.1", grpc_port), endpoints, picker_tls=shape == "ai-gateway",
                                 subset_header=SUBSET_HEADER if shape == "istio" else None,
                                 upstream_host_header=True)
    (envoy_dir / "bootstrap.yaml").write_text(dump(bootstrap))
    stack = Stack(workdir, policy, policy_path, envoy_dir, {"chat": sim}, [(grpc_port, admin_port)])
    return stack, document


class Client:
    def __init__(self, http: aiohttp.ClientSession, stack: Stack) -> None:
        self.http = http
        self.stack = stack
        self.url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"

    async def chat(self, content: str, tier: str = "default", *, tenant: str = "acme", max_tokens: int = 4,
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
        body = {"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
        sent = {"x-tenant-id": tenant, "x-tenant-tier": tier, **(headers or {})}
        async with self.http.post(self.url, json=body, headers=sent) as response:
            payload = json.loads(await response.read() or b"null")
            return response.status, payload, response.headers.get("x-gateway-upstream-host", "")

    async def pools(self) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.stack.admin_url}/debug/pools") as response:
            return list((await response.json())["pools"]["chat"])

    async def metric(self, name: str, labels: str) -> float:
        async with self.http.get(f"{self.stack.admin_url}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith(f"{name}{{") and labels in line:
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


async def picks_are_honoured_and_prefixes_stay_together(client: Client) -> None:
    before = {e["address"]: e["picked_total"] for e in await client.pools()}
    served: dict[int, set[str]] = {}
    hosts: Counter[str] = Counter()
    # Every client also names a destination itself (Envoy's own admin port): the picker's answer replaces it.
    hostile = {"x-gateway-destination-endpoint": f"127.0.0.1:{client.stack.policy.envoy.admin_port}"}
    for index in range(15):
        group = index % 3
        prompt = f"group {group} " + ("a shared system prompt about the group's documents. " * 60) + f"q{index}"
        status, payload, host = await client.chat(prompt, headers=hostile)
        assert status == 200, payload
        served.setdefault(group, set()).add(host)
        hosts[host] += 1
    assert all(len(where) == 1 for where in served.values()), served  # each prefix stayed on one endpoint
    after = {e["address"]: e["picked_total"] for e in await client.pools()}
    picked = {address: after[address] - before[address] for address in after if after[address] > before[address]}
    assert picked == dict(hosts)  # Envoy sent every request exactly where the picker said


async def limits_answer_429(client: Client) -> None:
    status, _, _ = await client.chat("hello", "limited", tenant="small")
    assert status == 200
    status, payload, _ = await client.chat("hello again", "limited", tenant="small")
    assert status == 429 and payload["error"]["code"] == "rate_limit_exceeded"


async def shedding_answers_429(client: Client) -> None:
    async def scraped() -> bool:
        return all(e["metrics_age_s"] is not None and e["metrics_age_s"] < 0.5 for e in await client.pools())

    await until(scraped, "fresh metrics of every endpoint")
    # One long generation per endpoint fills its only seat (max_num_seqs 1); a sheddable request is then refused.
    long_body = {"model": "chat", "messages": [{"role": "user", "content": "tell a long story"}], "max_tokens": 4000,
                 "ignore_eos": True, "stream": True}
    streams: list[aiohttp.ClientResponse] = []
    try:
        for index in range(POOL.replicas):
            response = await client.http.post(client.url, json={**long_body, "user": f"u{index}"},
                                              headers={"x-tenant-id": f"t{index}", "x-tenant-tier": "default"})
            assert response.status == 200
            await response.content.readline()  # generating
            streams.append(response)

        async def all_busy() -> bool:
            return all(e["in_flight"] == 1 for e in await client.pools())

        await until(all_busy, "every endpoint busy")
        status, payload, _ = await client.chat("may I?", "sheddable", tenant="batch")
        assert status == 429, payload
        assert payload["error"]["code"] == "overloaded_saturated"
    finally:
        for response in streams:
            response.close()


async def no_ready_endpoint_answers_503(client: Client) -> None:
    client.stack.children["sim"].send_signal(signal.SIGKILL)  # the whole fleet gone

    async def unavailable() -> bool:
        return not any(e["available"] for e in await client.pools())

    await until(unavailable, "every endpoint unavailable (failed scrapes)")
    status, payload, _ = await client.chat("anyone?")
    assert status == 503 and payload["error"]["code"] == "no_capacity"


async def run_shape(tmp_path: Path, shape: Shape, front_end: str,
                    extra: Callable[[Client], Awaitable[None]] | None = None) -> None:
    stack, _ = stack_for(tmp_path, shape, front_end)
    async with ProcessGroup(tmp_path / "logs") as group:
        stack.children["sim"] = await start_sim(group, tmp_path, [POOL], stack.sim_ports)
        stack.children["service"] = await start_service(group, stack)
        stack.children["envoy"] = await start_envoy(group, stack)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            client = Client(http, stack)
            await picks_are_honoured_and_prefixes_stay_together(client)
            await limits_answer_429(client)
            if extra is not None:
                await extra(client)
            await shedding_answers_429(client)
            # No access log in either shape: outcomes came from the served-endpoint metadata (Istio) or not at all.
            if shape == "istio":
                assert await client.metric("extproc_upstream_responses_total", 'status_class="2xx"') >= 15
            await no_ready_endpoint_answers_503(client)


async def subset_hint_conformance(client: Client) -> None:
    """The Inference Extension's picker checks: the subset is honoured, a subset with nothing eligible is 503."""
    endpoints = client.stack.policy.pools[0].endpoints
    for target in endpoints:
        for index in range(2):
            status, _, host = await client.chat(f"subset {target} {index}", headers={SUBSET_HEADER: target})
            assert (status, host) == (200, target)
    status, _, host = await client.chat("two allowed", headers={SUBSET_HEADER: f"10.255.0.1:1,{endpoints[1]}"})
    assert (status, host) == (200, endpoints[1])
    status, payload, _ = await client.chat("none eligible", headers={SUBSET_HEADER: "10.255.0.1:8000"})
    assert status == 503 and payload["error"]["code"] == "no_capacity"


FRONT_ENDS = pytest.mark.parametrize("front_end", ["lean", "grpcio"])


@FRONT_ENDS
async def test_istio_inference_pool_shape(tmp_path: Path, front_end: str) -> None:
    await run_shape(tmp_path, "istio", front_end, subset_hint_conformance)


@FRONT_ENDS
async def test_envoy_ai_gateway_shape_with_tls_to_the_picker(tmp_path: Path, front_end: str) -> None:
    await run_shape(tmp_path, "ai-gateway", front_end)
