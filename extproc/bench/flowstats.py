"""What flow control did to one measured run, from the service replicas' own Prometheus counters.

Counters are read before and after the run and subtracted, so a warm-up (the overload benchmark warms up
above capacity) does not count: requests refused, requests that waited in the admission queue, and how many
of those waited longer than one second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from extproc.bench.httpclient import HttpClient, RequestError

__all__ = ["FlowCounts", "flow_counts", "parse_flow_counts"]

_WAIT = "extproc_flow_queue_wait_seconds"
_REJECTED = "extproc_flow_rejected"


@dataclass(frozen=True)
class FlowCounts:
    queued: float = 0.0  # requests that waited in the admission queue (granted or timed out)
    over_1s: float = 0.0  # of those, waited longer than one second
    rejected: float = 0.0  # refused by flow control (shed at once, timed out, displaced, queue full)

    def __sub__(self, before: FlowCounts) -> FlowCounts:
        return FlowCounts(self.queued - before.queued, self.over_1s - before.over_1s,
                          self.rejected - before.rejected)

    def as_dict(self) -> dict[str, float]:
        return {"queued": self.queued, "waited_over_1s": self.over_1s, "rejected": self.rejected}


def parse_flow_counts(text: str) -> FlowCounts:
    queued = within_1s = rejected = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{_WAIT}_count":
                queued += sample.value
            elif sample.name == f"{_WAIT}_bucket" and float(sample.labels.get("le", "nan")) == 1.0:
                within_1s += sample.value
            elif sample.name == f"{_REJECTED}_total":
                rejected += sample.value
    return FlowCounts(queued, queued - within_1s, rejected)


async def flow_counts(client: HttpClient, admin_ports: Sequence[int]) -> FlowCounts:
    """The sum over the service replicas (an unreachable one counts nothing)."""
    total = FlowCounts()
    for port in admin_ports:
        try:
            response = await client.request("GET", "127.0.0.1", port, "/metrics", timeout_s=5.0)
        except RequestError:
            continue
        if response.status == 200:
            counts = parse_flow_counts(response.body.decode("utf-8", "replace"))
            total = FlowCounts(total.queued + counts.queued, total.over_1s + counts.over_1s,
                               total.rejected + counts.rejected)
    return total
