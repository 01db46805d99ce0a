"""Access-log entries: keyed by our request id, leases of exchanges decided elsewhere released, streams
without the gRPC token refused."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry

from extproc.gateway.usage import UsageReport, encode_reservation
from extproc.limits.memory import MemoryStore
from extproc.limits.types import AdmitRequest, ConcurrencyLimit, Reservation, TokenBudget
from extproc.server.access_log import AccessLogService, usage_report
from extproc.telemetry import GatewayMetrics

LEASE = ConcurrencyLimit("{t}:all:cc", 1)
BUDGET = TokenBudget("{t}:all:tpm", 1000, 60)


async def admit(store: MemoryStore, request_id: str) -> Reservation:
    request = AdmitRequest(request_id, time.time(), 500, concurrency=(LEASE,), budgets=(BUDGET,))
    assert (await store.admit(request)).admitted
    return Reservation.of(request)


def report(held: Reservation, prompt: int | None = 10, completion: int | None = 20) -> UsageReport:
    return UsageReport(held.request_id, 200, prompt, completion, encode_reservation(held), "chat", None)


async def test_leases_of_exchanges_decided_elsewhere_are_released_from_the_entry() -> None:
    store = MemoryStore()
    service = AccessLogService(store, GatewayMetrics(CollectorRegistry()),
                               decided_here=lambda rid: rid.startswith("me-"))
    foreign = await admit(store, "dead-replica-1")  # its replica died: no stream end will release it
    await service.record(report(foreign))
    mine = await admit(store, "me-1")  # the slot is free again
    await service.record(report(mine))  # released at its own stream end, not here
    refused = await store.admit(AdmitRequest("other", time.time(), 0, concurrency=(LEASE,)))
    assert not refused.admitted
    tokens = await store.admit(AdmitRequest("probe", time.time(), 0, budgets=(BUDGET,)))
    assert next(s for s in tokens.states if s.name == "tokens").remaining == 1000 - 30 - 30  # both settled


def test_usage_report_is_keyed_by_our_request_id() -> None:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.request.request_id = "client-chosen"  # the x-request-id header: the client's to choose
    ours = struct_pb2.Struct()
    ours.update({"request_id": "ours-1"})
    entry.common_properties.metadata.filter_metadata["extproc"].CopyFrom(ours)
    assert usage_report(entry).request_id == "ours-1"


def test_the_gateways_delay_before_upstream_is_recorded_per_pool() -> None:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.response.response_code.value = 200
    ours = struct_pb2.Struct()
    ours.update({"request_id": "ours-1", "pool": "chat"})
    entry.common_properties.metadata.filter_metadata["extproc"].CopyFrom(ours)
    entry.common_properties.time_to_first_upstream_tx_byte.FromMilliseconds(4)
    entry.common_properties.time_to_first_upstream_rx_byte.FromMilliseconds(9)
    registry = CollectorRegistry()
    service = AccessLogService(MemoryStore(), GatewayMetrics(registry))
    service.observe(usage_report(entry))
    service.observe(usage_report(accesslog_pb2.HTTPAccessLogEntry()))  # never sent upstream: not counted
    sample = "extproc_upstream_send_seconds_bucket"
    assert registry.get_sample_value(sample, {"pool": "chat", "le": "0.003"}) == 0
    assert registry.get_sample_value(sample, {"pool": "chat", "le": "0.005"}) == 1
    assert registry.get_sample_value("extproc_upstream_send_seconds_count", {"pool": "chat"}) == 1


class Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata, self.aborted = metadata, None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = code
        raise grpc.aio.AbortError()


async def test_streams_without_the_token_are_refused() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    service = AccessLogService(MemoryStore(), metrics, token="t0k3n")

    async def messages() -> Any:
        yield als_pb2.StreamAccessLogsMessage()

    context = Context((("x-extproc-token", "nope"),))
    with pytest.raises(grpc.aio.AbortError):
        await service.StreamAccessLogs(messages(), context)  # type: ignore[arg-type]
    assert context.aborted == grpc.StatusCode.UNAUTHENTICATED and service.entries_total == 0
    await service.StreamAccessLogs(messages(), Context((("x-extproc-token", "t0k3n"),)))  # type: ignore[arg-type]
    assert metrics.refused_streams.labels("access_log")._value.get() == 1
