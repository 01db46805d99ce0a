"""Decision spans over OpenTelemetry (policy `tracing`); imported and built only when tracing is on, so that a
service with tracing off imports no SDK and pays one `is None` test per request phase.

One span per exchange, from its request headers to the end of its ext_proc stream, named `extproc.decision`,
with the GenAI semantic conventions where they apply (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.request.max_tokens`, `gen_ai.usage.input_tokens` / `output_tokens`) and ours for the rest (pool,
endpoint, profile, outcome, priority class, decision time, estimates). Its parent is the W3C `traceparent` the
client sent (a valid one, honouring its sampled flag), else the one Envoy's tracer put on the ext_proc stream,
else none (a new trace, sampled at `sample_ratio`). A routed request carries `traceparent` naming our span to
the engine (vLLM joins with `--otlp-traces-endpoint`). Spans wait for the exchange's access-log entry (usage
tokens) for up to `USAGE_WAIT_S`, then end without it. Export runs in the SDK's batch thread, off the event loop.
"""

from __future__ import annotations

import random
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span

from extproc.telemetry.tracing_config import TracingConfig

__all__ = ["OPERATIONS", "DecisionTracer", "parse_traceparent"]

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
USAGE_WAIT_S = 5.0
PENDING_MAX = 10_000
# gen_ai.operation.name per API (GenAI semantic conventions); the others use the API's own name.
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a valid W3C traceparent (version 00), else None: client input,
    so anything malformed, all-zero or over-long is ignored."""
    if not value or len(value) != 55:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(match[3], 16) & 1)


def _stream_traceparent(metadata: Iterable[tuple[str, str]] | None) -> str | None:
    """The `traceparent` Envoy's tracer put on the ext_proc stream (gRPC metadata, as grpc.aio hands it)."""
    for key, value in metadata or ():
        if key == "traceparent":
            return value
    return None


@dataclass(slots=True)
class _Pending:
    span: Span
    end_ns: int
    expires: float


class DecisionTracer:
    """Starts, annotates and ends decision spans; owns the SDK's provider (and its export thread)."""

    def __init__(self, config: TracingConfig, *, exporter: SpanExporter | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: Callable[[], float] = random.random) -> None:
        if exporter is None:
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError as exc:  # xds-protos ships older copies of opentelemetry-proto's modules
                raise RuntimeError(
                    f"the OTLP exporter cannot load ({exc}): xds-protos installed its own older "
                    "opentelemetry/proto modules over opentelemetry-proto's; reinstall opentelemetry-proto "
                    "(pip install --force-reinstall --no-deps opentelemetry-proto==<its version>)") from exc

            exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=True, timeout=2)
        self._provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        self._tracer = self._provider.get_tracer("extproc")
        self._ratio = config.sample_ratio
        self._rate = config.max_spans_per_s
        self._allowance = config.max_spans_per_s
        self._last = clock()
        self._clock = clock
        self._rng = rng
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    def _budget(self) -> bool:
        """Token bucket of spans per second (burst one second's worth)."""
        now = self._clock()
        self._allowance = min(self._rate, self._allowance + (now - self._last) * self._rate)
        self._last = now
        if self._allowance < 1:
            return False
        self._allowance -= 1
        return True

    def start(self, headers: Mapping[str, str], stream_metadata: Iterable[tuple[str, str]] | None) -> Span | None:
        """A span for this exchange if it is sampled, else None, and then nothing else is done for it: no span
        object, no attribute, no header; the stream's metadata is searched only when the client sent no valid
        traceparent, and nothing is allocated but the parsed parent."""
        parent = parse_traceparent(headers.get("traceparent"))
        if parent is None:
            parent = parse_traceparent(_stream_traceparent(stream_metadata))
        sampled = parent[2] if parent is not None else self._rng() < self._ratio
        if not sampled or not self._budget():
            return None
        context = None
        if parent is not None:
            remote = trace.SpanContext(parent[0], parent[1], is_remote=True, trace_flags=trace.TraceFlags(1))
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        return self._tracer.start_span("extproc.decision", context=context, kind=trace.SpanKind.SERVER)

    @staticmethod
    def traceparent(span: Span) -> str:
        """Our span as the engine's parent."""
        context = span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"

    def finish(self, span: Span, attributes: Mapping[str, Any], request_id: str | None) -> None:
        """The exchange ended: record what it was; end the span now, or when its usage arrives."""
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        now = self._clock()
        self._expire(now)
        if request_id is None:
            span.end()
            return
        self._pending[request_id] = _Pending(span, time.time_ns(), now + USAGE_WAIT_S)
        if len(self._pending) > PENDING_MAX:
            self._end_oldest()

    def usage(self, request_id: str, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The access log's entry for `request_id` (ours): its usage, then the span ends."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        if prompt_tokens is not None:
            pending.span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        if completion_tokens is not None:
            pending.span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        pending.span.end(end_time=pending.end_ns)

    def _end_oldest(self) -> None:
        _, pending = self._pending.popitem(last=False)
        pending.span.end(end_time=pending.end_ns)

    def _expire(self, now: float) -> None:
        while self._pending and next(iter(self._pending.values())).expires <= now:
            self._end_oldest()

    def flush(self) -> None:
        """Export every ended span now (blocking)."""
        self._provider.force_flush()

    def shutdown(self) -> None:
        """End what waits for usage and flush the exporter (blocking: call it off the event loop)."""
        while self._pending:
            self._end_oldest()
        self._provider.shutdown()
