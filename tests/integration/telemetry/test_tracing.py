"""Tracing through real Envoy + service + simulator, into a real OTLP/gRPC receiver (the collector's
TraceService from opentelemetry-proto) run by the test: Envoy's span and our decision span share one trace id,
a client's traceparent is honoured, the engine gets the trace context, usage lands on the span."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from tests.support import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """Every span exported to it: (service.name, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []

    async def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def wait_for(self, trace_id: bytes, services: set[str], attribute: str | None = None) -> dict[str, Any]:
        """The spans of `trace_id` by service once every service in `services` has one (bounded)."""

        def complete() -> dict[str, Any] | None:
            found = {service: span for service, span in self.spans if span.trace_id == trace_id}
            if services <= set(found) and (attribute is None or attribute in attributes(found["extproc"])):
                return found
            return None

        spans: dict[str, Any] = await eventually(complete, f"spans of {trace_id.hex()} from {sorted(services)}",
                                                 timeout_s=10, interval_s=0.1)
        return spans


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        out[item.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return out


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    server = grpc.aio.server()
    collector = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield collector, port
    await server.stop(0)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, receiver: tuple[Receiver, int]) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("tracing")
    policy = {"tracing": {"enabled": True, "otlp_endpoint": f"127.0.0.1:{receiver[1]}", "sample_ratio": 1.0}}
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [POOL], extra_policy=policy, sim_args=["--profile", "fast"])


async def ask(stack: Stack, **headers: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": "chat", "max_tokens": 6, "messages": [{"role": "user", "content": "trace me"}]}
    async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{stack.envoy_port}/v1/messages", json=body, headers=headers) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(await response.text())


async def engine_headers(upstream: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://{upstream}/sim/last-request",
                                                         params={"path": "/v1/messages"}) as response:
        return {k.lower(): v for k, v in (await response.json()).items()}


async def test_client_traceparent_is_honoured_and_reaches_the_engine(
        stack: Stack, receiver: tuple[Receiver, int]) -> None:
    collector = receiver[0]
    trace_id, parent = secrets.token_bytes(16), secrets.token_bytes(8)
    status, headers, reply = await ask(stack, traceparent=f"00-{trace_id.hex()}-{parent.hex()}-01")
    assert status == 200, reply
    spans = await collector.wait_for(trace_id, {"envoy", "extproc"}, "gen_ai.usage.output_tokens")
    ours = spans["extproc"]
    assert ours.parent_span_id == parent  # the client's span is our parent
    found = attributes(ours)
    assert found["gen_ai.request.model"] == "chat" and found["gen_ai.operation.name"] == "chat"
    assert found["extproc.pool"] == "chat" and found["server.address"] == headers["x-gateway-upstream-host"]
    assert found["gen_ai.usage.input_tokens"] == reply["usage"]["input_tokens"]
    assert found["gen_ai.usage.output_tokens"] == reply["usage"]["output_tokens"]
    # The sampled decision's scores, as /debug/explain shows them: per scorer for the pick, and per endpoint.
    per_scorer = {k.removeprefix("extproc.score."): v for k, v in found.items() if k.startswith("extproc.score.")}
    assert per_scorer and all(0.0 <= v <= 1.0 for v in per_scorer.values())
    scores = json.loads(found["extproc.scores"])
    picked = scores[found["server.address"]]
    assert found["extproc.scored_endpoints"] == 2 and set(scores) <= {f"127.0.0.1:{p}" for p in stack.sim_ports["chat"]}
    assert picked["total"] == found["extproc.score_total"] == max(s["total"] for s in scores.values())
    assert {k: v for k, v in picked.items() if k != "total"} == per_scorer
    engine = (await engine_headers(headers["x-gateway-upstream-host"]))["traceparent"]
    assert engine.split("-")[1] == trace_id.hex()  # the engine joins the same trace


async def test_without_a_client_trace_envoy_and_we_share_one(stack: Stack, receiver: tuple[Receiver, int]) -> None:
    collector = receiver[0]
    before = len(collector.spans)
    status, headers, _ = await ask(stack)
    assert status == 200
    ours = await eventually(lambda: [span for service, span in collector.spans[before:] if service == "extproc"],
                            "our decision span", timeout_s=10, interval_s=0.1)
    spans = await collector.wait_for(ours[0].trace_id, {"envoy", "extproc"})
    assert spans["envoy"].trace_id == spans["extproc"].trace_id
    engine = (await engine_headers(headers["x-gateway-upstream-host"]))["traceparent"]
    assert engine.split("-")[1] == ours[0].trace_id.hex()


async def test_hostile_traceparents_are_ignored(stack: Stack, receiver: tuple[Receiver, int]) -> None:
    hostile = ("00-" + "0" * 32 + "-" + "1" * 16 + "-01", "zz-bad", "00-" + "a" * 200, "01-" + "a" * 32 + "-"
               + "b" * 16 + "-01")
    before = len([1 for service, _ in receiver[0].spans if service == "extproc"])
    for value in hostile:
        status, _, _ = await ask(stack, traceparent=value)
        assert status == 200  # a new trace instead; never an error
    await eventually(lambda: len([1 for service, _ in receiver[0].spans if service == "extproc"]) >= before + 4,
                     "a decision span for each hostile traceparent", timeout_s=10, interval_s=0.1)
    assert all(span.trace_id != bytes(16) for _, span in receiver[0].spans)
