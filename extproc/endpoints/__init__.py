"""Endpoint registry per pool and in-flight accounting."""

from extproc.endpoints.metrics import EndpointMetrics
from extproc.endpoints.registry import Endpoint, EndpointRegistry, Lease
from extproc.endpoints.scraper import MetricsScraper
from extproc.endpoints.vllm_metrics import parse_vllm_metrics

__all__ = [
    "Endpoint",
    "EndpointMetrics",
    "EndpointRegistry",
    "Lease",
    "MetricsScraper",
    "parse_vllm_metrics",
]
