"""Endpoint registry per pool and in-flight accounting."""

from extproc.endpoints.registry import Endpoint, EndpointRegistry, Lease, PoolState

__all__ = ["Endpoint", "EndpointRegistry", "Lease", "PoolState"]
