"""Metrics and logs."""

from extproc.telemetry.metrics import GatewayMetrics

__all__ = ["GatewayMetrics"]
