"""gRPC access log service (ALS): Envoy reports every finished exchange here.

Each entry carries the final status, the upstream host, and the dynamic metadata Envoy collected:
usage tokens (namespace `extproc.usage`, written by json_to_metadata / sse_to_metadata) and our own
reservation (namespace `extproc`, from the ext_proc reply). Usage is settled in the limit store, so
no SSE chunk ever passes through Python. The replica that decided an exchange releases its concurrency
leases when the ext_proc stream ends; an entry decided by another process (which may have died while
Envoy finished the exchange: its stream end never came) has its leases released here (idempotent).

Entries are keyed by our own request id (from our metadata), never by the client's x-request-id, and
streams must carry the gRPC token (grpc_auth.py) when one is configured: a forged entry could otherwise
refund a running request or drain another tenant's budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from extproc.gateway.usage import UsageReport, decode_reservation, settlement
from extproc.limits.types import Reservation, Store
from extproc.rollout.analysis import tpot_seconds
from extproc.server.grpc_auth import authorized, refuse
from extproc.server.protocol import METADATA_NAMESPACE
from extproc.telemetry import GatewayMetrics

log = logging.getLogger(__name__)

USAGE_NAMESPACE = "extproc.usage"
_UPSTREAM_FAILURES = frozenset({"upstream_remote_reset", "upstream_connection_termination",
                                "upstream_request_timeout", "upstream_connection_failure"})


def _number(fields: Any, key: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return int(value.number_value)
    if kind == "string_value" and value.string_value.isdigit():
        return int(value.string_value)
    return None


def _string(fields: Any, key: str) -> str | None:
    value = fields.get(key)
    return value.string_value if value is not None and value.WhichOneof("kind") == "string_value" else None


def usage_report(entry: accesslog_pb2.HTTPAccessLogEntry) -> UsageReport:
    common = entry.common_properties
    metadata = common.metadata.filter_metadata
    usage = metadata[USAGE_NAMESPACE].fields if USAGE_NAMESPACE in metadata else {}
    ours = metadata[METADATA_NAMESPACE].fields if METADATA_NAMESPACE in metadata else {}
    upstream = common.upstream_remote_address.socket_address
    flags = common.response_flags
    flag_names = [f.name for f, v in flags.ListFields() if v is True]
    return UsageReport(
        request_id=_string(ours, "request_id") or "",
        status=entry.response.response_code.value,
        prompt_tokens=_number(usage, "prompt_tokens"),
        completion_tokens=_number(usage, "completion_tokens"),
        reservation=_string(ours, "reservation"),
        pool=_string(ours, "pool"),
        upstream_host=f"{upstream.address}:{upstream.port_value}" if upstream.address else None,
        response_flags=",".join(flag_names),
        first_byte_s=_seconds(common.time_to_first_upstream_rx_byte),
        last_byte_s=_seconds(common.time_to_last_upstream_rx_byte),
        prompt_estimate=_number(ours, "prompt_estimate"),
        sent_s=_seconds(common.time_to_first_upstream_tx_byte),
    )


def _failed(report: UsageReport) -> bool:
    return any(flag in _UPSTREAM_FAILURES for flag in report.response_flags.split(","))


def _seconds(duration: Any) -> float | None:
    return duration.seconds + duration.nanos / 1e9 if duration.ByteSize() else None


class AccessLogService(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    def __init__(self, store: Store, metrics: GatewayMetrics,
                 on_outcome: Callable[[str, str | None, bool, float | None], None] | None = None,
                 on_pool_outcome: Callable[[str, bool, float | None, float | None], None] | None = None,
                 on_prompt_usage: Callable[[str, int, int], None] | None = None, token: str | None = None,
                 decided_here: Callable[[str], bool] | None = None,
                 on_usage: Callable[[str, int | None, int | None], None] | None = None) -> None:
        self._store = store
        self._token = token  # shared secret Envoy sends (grpc_auth.py); None = no check
        self._decided_here = decided_here  # this process's own request ids (released at their stream end)
        self._on_usage = on_usage  # tracing: (our request id, prompt, completion tokens); None when off
        self._metrics = metrics
        self._on_outcome = on_outcome
        self._on_pool_outcome = on_pool_outcome  # canary analysis: (pool, ok, ttft_s, tpot_s)
        self._on_prompt_usage = on_prompt_usage  # prompt calibration: (pool, our estimate, real prompt tokens)
        self._cpu = metrics.phase_cpu["access_log"].inc  # CPU of parsing and recording entries
        self.entries_total = 0
        self.settled_total = 0

    async def StreamAccessLogs(
        self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> als_pb2.StreamAccessLogsResponse:
        if self._token is not None and not authorized(context, self._token):
            self._metrics.refused_streams.labels("access_log").inc()
            await refuse(context)
            return als_pb2.StreamAccessLogsResponse()
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                try:
                    started = time.thread_time()
                    report = usage_report(entry)
                    self._cpu(time.thread_time() - started)
                    await self.record(report)
                except Exception:  # one bad entry must not end Envoy's log stream
                    log.exception("access log entry could not be processed")
        return als_pb2.StreamAccessLogsResponse()

    async def record(self, report: UsageReport) -> None:
        started = time.thread_time()
        held, settle = self.observe(report)
        self._cpu(time.thread_time() - started)
        if held is not None:
            try:
                await self._store.release(held, time.time())
            except Exception:
                self._metrics.store_failures.labels("release").inc()
        if settle is None:
            return
        held, tokens = settle
        try:
            await self._store.settle(held, tokens, time.time())
            self.settled_total += 1
        except Exception:
            self._metrics.store_failures.labels("settle").inc()
            log.warning("settling usage of %s failed; the reserved estimate stands", held.request_id)

    def observe(self, report: UsageReport) -> tuple[Reservation | None, tuple[Reservation, int] | None]:
        """Record the entry's outcome (metrics, health, canary analysis, calibration); returns the leases to
        release here (decided by another process) and the settlement to make, for the store."""
        self.entries_total += 1
        pool = report.pool or "none"
        if self._on_usage is not None and report.request_id:
            self._on_usage(report.request_id, report.prompt_tokens, report.completion_tokens)
        # Passive health: 5xx, and failures after the response headers (a replica dying mid-stream).
        # Envoy retries only failures before any response, so this is the endpoint that answered.
        if report.pool and report.status:
            self._metrics.upstream_status.labels(report.pool, f"{report.status // 100}xx").inc()
        if self._on_outcome is not None and report.upstream_host and report.pool:
            ok = 0 < report.status < 500 and not _failed(report)
            self._on_outcome(report.upstream_host, report.pool, ok, report.first_byte_s)
        if (self._on_prompt_usage is not None and report.pool and report.prompt_estimate
                and report.prompt_tokens):
            self._on_prompt_usage(report.pool, report.prompt_estimate, report.prompt_tokens)
        if report.prompt_tokens is not None:  # alone: a shape that generates nothing (see settlement)
            self._metrics.usage_tokens.labels(pool, "prompt").inc(report.prompt_tokens)
            self._metrics.usage_tokens.labels(pool, "completion").inc(report.completion_tokens or 0)
        elif report.reservation:
            self._metrics.usage_missing.labels(pool).inc()
        if report.pool:
            ok = report.status != 0 and report.status < 500 and not _failed(report)
            ttft = report.first_byte_s
            tpot = None
            if ttft is not None and report.last_byte_s is not None and report.completion_tokens:
                tpot = tpot_seconds(ttft, report.last_byte_s, report.completion_tokens)
            if ttft is not None:
                self._metrics.ttfb_seconds.labels(report.pool).observe(ttft)
            if report.sent_s is not None:
                self._metrics.upstream_send_seconds.labels(report.pool).observe(report.sent_s)
            if tpot is not None:
                self._metrics.tpot_seconds.labels(report.pool).observe(tpot)
            if self._on_pool_outcome is not None:
                self._on_pool_outcome(report.pool, ok, ttft, tpot)
        held = decode_reservation(report.reservation) if report.reservation else None
        release = held if held is not None and held.concurrency and not (
            self._decided_here is not None and self._decided_here(held.request_id)) else None
        return release, settlement(report, held)
