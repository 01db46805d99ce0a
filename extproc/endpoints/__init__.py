"""Endpoint registry per pool and in-flight accounting."""

from extproc.endpoints.registry import Endpoint, EndpointMetrics, EndpointRegistry, Lease, PoolState
from extproc.endpoints.scraper import MetricsScraper
from extproc.endpoints.vllm_metrics import parse_vllm_metrics

__all__ = [
    "Endpoint",
    "EndpointMetrics",
    "EndpointRegistry",
    "Lease",
    "MetricsScraper",
    "PoolState",
    "parse_vllm_metrics",
]
