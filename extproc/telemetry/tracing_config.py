"""Policy model of tracing (mounted as `Policy.tracing`): OpenTelemetry spans of our decisions, exported over
OTLP/gRPC, and Envoy's own OpenTelemetry tracer in the rendered configuration, so that both join one trace."""

from __future__ import annotations

from pydantic import Field, field_validator

from extproc.policy_types import Strict

__all__ = ["TracingConfig"]


class TracingConfig(Strict):
    enabled: bool = False
    otlp_endpoint: str = Field(default="127.0.0.1:4317", description="host:port of the OTLP/gRPC collector")
    sample_ratio: float = Field(default=0.01, ge=0.0, le=1.0,
                                description="share of requests without a sampled parent that are traced")
    max_spans_per_s: float = Field(default=100.0, gt=0, le=100_000,
                                   description="most decision spans per second per process; a client's sampled "
                                               "traceparent cannot force more")
    service_name: str = Field(default="extproc", min_length=1, max_length=128)
    envoy: bool = Field(default=True, description="render Envoy's own OpenTelemetry tracer (same collector, ratio)")

    @field_validator("otlp_endpoint")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in value):
            raise ValueError(f"otlp_endpoint {value!r} must be host:port")
        return value
