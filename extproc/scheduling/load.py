"""How busy an endpoint is, from the freshest information this process has."""

from __future__ import annotations

from extproc.endpoints import Endpoint, EndpointMetrics


def fresh_metrics(endpoint: Endpoint, now: float, stale_after_s: float) -> EndpointMetrics | None:
    metrics = endpoint.metrics
    if metrics is None or now - metrics.scraped_at > stale_after_s:
        return None
    return metrics


def request_load(endpoint: Endpoint, now: float, stale_after_s: float, replicas: int = 1) -> float:
    """Requests running + waiting on the endpoint.

    The scrape sees every gateway replica's traffic but lags; our own in-flight count is exact but
    covers only this replica (scaled by the replica count). The larger of the two is the safer guess.
    """
    local = float(endpoint.in_flight * replicas)
    metrics = fresh_metrics(endpoint, now, stale_after_s)
    if metrics is None:
        return local
    return max(metrics.running + metrics.waiting, local)
