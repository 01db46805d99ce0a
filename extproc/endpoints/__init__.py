"""Endpoint registry per pool and in-flight accounting."""

from extproc.endpoints.registry import Endpoint, EndpointMetrics, EndpointRegistry, Lease, PoolState

__all__ = ["Endpoint", "EndpointMetrics", "EndpointRegistry", "Lease", "PoolState"]
