"""KEDA's external scaler through a real gRPC channel (a client protoc compiles from KEDA's proto), and a pool that
scales from zero through real Envoy + service + simulator: held requests, StreamIsActive, release, timeout."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, prepare, start_envoy, start_service, start_sim
from tests.keda import client_modules
from tests.support import eventually, holds_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

WARM = SimPool("warm", "org/warm", 1, aliases=("warm",), options=(("target_per_replica", 4.0),))
COLD = SimPool("cold", "org/cold", 1, aliases=("cold",), options=(("cold_start_timeout_s", 20.0),))
NEVER = SimPool("never", "org/never", 1, aliases=("never",), options=(("cold_start_timeout_s", 2.0),))
CLASS_WAIT_S = 1.0
STABILISATION_S = 1.0
POLICY: dict[str, Any] = {
    "scheduling": {"scrape": {"interval_ms": 50}},
    "flow_control": {"classes": {"standard": {"priority": 50, "max_wait_s": CLASS_WAIT_S}},
                     "default_class": "standard"},
    "autoscaling": {"enabled": True, "allow_unauthenticated": True, "sample_interval_s": 0.1, "predict_s": 0,
                    "target_per_replica": 6,
                    "scale_down_stabilization_s": STABILISATION_S, "max_streams": 3},
}


class Keda:
    def __init__(self, pb2: ModuleType, grpc_module: ModuleType, channel: grpc.aio.Channel) -> None:
        self.pb2 = pb2
        self.stub = grpc_module.ExternalScalerStub(channel)

    def ref(self, pool: str | None) -> Any:
        metadata = {"scalerAddress": "extproc:9002"} | ({"pool": pool} if pool is not None else {})
        return self.pb2.ScaledObjectRef(name=f"vllm-{pool}", namespace="ai", scalerMetadata=metadata)

    async def value(self, pool: str) -> float:
        request = self.pb2.GetMetricsRequest(scaledObjectRef=self.ref(pool), metricName=f"extproc-demand-{pool}")
        response = await self.stub.GetMetrics(request)
        (value,) = response.metricValues
        assert value.metricName == f"extproc-demand-{pool}"
        return float(value.metricValueFloat)

    async def active(self, pool: str) -> bool:
        return bool((await self.stub.IsActive(self.ref(pool))).result)


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=["lean", "grpcio"])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> AsyncIterator[tuple[Stack, ProcessGroup, list[str]]]:
    """The scaler on the service's shared gRPC port, served by each front end."""
    workdir: Path = tmp_path_factory.mktemp(f"scaler-{request.param}")
    profile = workdir / "steady.yaml"
    profile.write_text(json.dumps({"base": "fast", "name": "steady", "step_base_s": 0.01, "max_tokens_cap": 2048,
                                   "min_output_fraction": 1.0}))
    sim_args = ["--profile", str(profile)]
    async with ProcessGroup(workdir / "logs") as group:
        stack = prepare(workdir, [WARM, COLD, NEVER], extra_policy={**POLICY, "service": {"front_end": request.param}})
        await start_sim(group, workdir, [WARM], stack.sim_ports, sim_args)  # cold and never: no replica yet
        await start_service(group, stack)
        await start_envoy(group, stack)
        yield stack, group, sim_args


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def keda(stack: tuple[Stack, ProcessGroup, list[str]], tmp_path_factory: pytest.TempPathFactory
               ) -> AsyncIterator[Keda]:
    pb2, grpc_module = client_modules(tmp_path_factory.mktemp("keda-client"))
    port = stack[0].policy.service.grpc_port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Keda(pb2, grpc_module, channel)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def chat(http: aiohttp.ClientSession, stack: Stack, model: str, max_tokens: int = 4
               ) -> tuple[int, dict[str, str], Any]:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions", json=payload) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, await response.json(
            content_type=None)


async def test_metric_spec_metrics_and_errors_follow_kedas_contract(keda: Keda, stack: Any,
                                                                    http: aiohttp.ClientSession) -> None:
    spec = await keda.stub.GetMetricSpec(keda.ref("warm"))
    (metric,) = spec.metricSpecs
    assert (metric.metricName, metric.targetSize, metric.targetSizeFloat) == ("extproc-demand-warm", 4, 4.0)
    cold_spec = (await keda.stub.GetMetricSpec(keda.ref("cold"))).metricSpecs[0]
    assert cold_spec.targetSizeFloat == 6.0  # the policy's default target
    # Hostile or broken trigger metadata: a clear gRPC status, nothing else.
    for ref, code in ((keda.ref(None), grpc.StatusCode.INVALID_ARGUMENT),
                      (keda.ref("x" * 100_000), grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await keda.stub.IsActive(ref)
        assert failed.value.code() == code and len(failed.value.details() or "") < 200
    wrong = keda.pb2.GetMetricsRequest(scaledObjectRef=keda.ref("warm"), metricName="extproc-demand-cold")
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await keda.stub.GetMetrics(wrong)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Demand is what the engines run: three long requests show as ~3 (the value is the stabilised maximum).
    service_stack: Stack = stack[0]
    assert await keda.value("warm") == 0.0 and not await keda.active("warm")
    calls = [asyncio.create_task(chat(http, service_stack, "warm", max_tokens=300)) for _ in range(3)]

    async def three() -> bool:
        return await keda.value("warm") >= 3.0

    await eventually(three, "the scaler reporting the three requests", timeout_s=10)
    assert await keda.active("warm")
    assert [status for status, _, _ in await asyncio.gather(*calls)] == [200, 200, 200]

    async def idle() -> bool:
        return await keda.value("warm") == 0.0

    await eventually(idle, "the pool idle after the stabilisation window", timeout_s=10)
    assert not await keda.active("warm")


async def test_stream_is_active_is_bounded(keda: Keda) -> None:
    streams = [keda.stub.StreamIsActive(keda.ref("warm")) for _ in range(3)]
    for stream in streams:
        assert (await stream.read()).result is False  # the state at once, on opening
    extra = keda.stub.StreamIsActive(keda.ref("warm"))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await extra.read()
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for stream in streams:
        stream.cancel()

    async def freed() -> bool:  # the server counts a cancelled stream out once its handler unwinds
        probe = keda.stub.StreamIsActive(keda.ref("warm"))
        try:
            await probe.read()
            return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            probe.cancel()

    await eventually(freed, "the pool's demand back to zero", timeout_s=10)


async def test_a_cold_pool_holds_requests_until_its_first_replica_is_ready(
        keda: Keda, stack: tuple[Stack, ProcessGroup, list[str]], http: aiohttp.ClientSession) -> None:
    service_stack, group, sim_args = stack
    stream = keda.stub.StreamIsActive(keda.ref("cold"))
    assert (await stream.read()).result is False
    started = time.monotonic()
    calls = [asyncio.create_task(chat(http, service_stack, "cold")) for _ in range(3)]
    # KEDA hears at once that the pool must scale from zero (not at the next sample).
    assert (await asyncio.wait_for(stream.read(), 2.0)).result is True
    assert await keda.active("cold")

    async def held() -> bool:
        return await keda.value("cold") >= 3.0

    await eventually(held, "three requests held for the cold pool", timeout_s=10)
    # Time is the behaviour here: held past the class's own wait, nobody answered yet.
    await holds_for(lambda: not any(call.done() for call in calls), "the cold pool's requests held",
                    CLASS_WAIT_S + 0.5)
    await start_sim(group, service_stack.workdir, [COLD], service_stack.sim_ports, sim_args)
    results = await asyncio.wait_for(asyncio.gather(*calls), 30)
    waited = time.monotonic() - started
    assert [status for status, _, _ in results] == [200, 200, 200], results
    assert waited > CLASS_WAIT_S + 0.5
    async with http.get(f"{service_stack.admin_url}/debug/flow") as response:
        flow = (await response.json())["pools"]["cold"]["classes"]["standard"]
    assert flow["granted"] == 3 and flow["rejected"] == {}
    # Idle again: inactive once the stabilisation window has passed.
    assert (await asyncio.wait_for(stream.read(), 10.0)).result is False
    stream.cancel()


async def test_a_pool_that_never_becomes_ready_answers_503_with_retry_after(
        stack: tuple[Stack, ProcessGroup, list[str]], http: aiohttp.ClientSession) -> None:
    started = time.monotonic()
    status, headers, body = await chat(http, stack[0], "never")
    waited = time.monotonic() - started
    assert status == 503 and "retry-after" in headers
    assert body["error"]["code"] == "overloaded_cold_start"
    assert 1.5 < waited < 10.0  # held up to the pool's cold_start_timeout_s (2 s), then refused
