"""Decision spans (extproc/telemetry/tracing.py): hostile traceparents, sampling, the span budget, usage."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from extproc.telemetry.tracing import USAGE_WAIT_S, DecisionTracer, parse_traceparent
from extproc.telemetry.tracing_config import TracingConfig

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def tracer(now: list[float], ratio: float = 0.0, per_s: float = 100.0,
           draws: list[float] | None = None) -> tuple[DecisionTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    values = iter(draws or [])
    made = DecisionTracer(TracingConfig(enabled=True, sample_ratio=ratio, max_spans_per_s=per_s), exporter=exporter,
                          clock=lambda: now[0], rng=lambda: next(values, 0.99))
    return made, exporter


def test_traceparent_parsing_refuses_anything_malformed() -> None:
    assert parse_traceparent(TRACE) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert parse_traceparent(TRACE[:-2] + "00")[2] is False  # type: ignore[index]
    for bad in (None, "", TRACE.upper(), TRACE + "-x", "01" + TRACE[2:], TRACE.replace("4bf9", "00000")[:55],
                "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
                "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "x" * 10_000):
        assert parse_traceparent(bad) is None, bad


def test_sampling_follows_the_parent_else_the_ratio() -> None:
    now = [0.0]
    made, exporter = tracer(now, ratio=0.5, draws=[0.2, 0.7])
    assert made.start({"traceparent": TRACE[:-2] + "00"}, None) is None  # the parent said no
    child = made.start({"traceparent": TRACE}, None)
    assert child is not None
    assert made.traceparent(child).split("-")[1] == TRACE.split("-")[1]
    sampled = made.start({}, None)
    assert sampled is not None  # 0.2 < 0.5
    assert made.start({}, None) is None  # 0.7
    from_envoy = made.start({}, (("grpc-timeout", "5S"), ("traceparent", TRACE)))
    assert from_envoy is not None  # Envoy's context on the stream, when the client sent none
    for span in (child, sampled, from_envoy):
        made.finish(span, {}, None)
    made.flush()
    finished = exporter.get_finished_spans()
    assert len(finished) == 3
    assert finished[0].parent is not None and finished[0].parent.span_id == 0x00F067AA0BA902B7
    assert finished[1].parent is None  # a new trace
    made.shutdown()


def test_a_client_cannot_force_more_spans_than_the_budget() -> None:
    now = [0.0]
    made, _ = tracer(now, per_s=10)
    assert sum(made.start({"traceparent": TRACE}, None) is not None for _ in range(100)) == 10
    now[0] += 0.5
    assert sum(made.start({"traceparent": TRACE}, None) is not None for _ in range(100)) == 5
    made.shutdown()


def test_spans_end_with_usage_or_after_the_wait() -> None:
    now = [0.0]
    made, exporter = tracer(now)
    first, second, refused = (made.start({"traceparent": TRACE}, None) for _ in range(3))
    assert first is not None and second is not None and refused is not None
    made.finish(first, {"gen_ai.request.model": "m", "extproc.pool": None}, "r1")
    made.finish(second, {}, "r2")
    made.finish(refused, {"extproc.outcome": "rejected_429"}, None)  # never routed: ends at once
    made.usage("r1", 12, 3)
    made.usage("unknown", 1, 1)
    made.flush()
    spans = {s.attributes.get("gen_ai.request.model", s.attributes.get("extproc.outcome")): s  # type: ignore[union-attr]
             for s in exporter.get_finished_spans()}
    assert set(spans) == {"m", "rejected_429"}
    assert spans["m"].attributes["gen_ai.usage.input_tokens"] == 12  # type: ignore[index]
    assert "extproc.pool" not in spans["m"].attributes  # type: ignore[operator]
    now[0] += USAGE_WAIT_S + 1
    third = made.start({"traceparent": TRACE}, None)
    assert third is not None
    made.finish(third, {}, None)  # finishing expires r2, which never got its usage
    made.flush()
    assert len(exporter.get_finished_spans()) == 4
    made.shutdown()
