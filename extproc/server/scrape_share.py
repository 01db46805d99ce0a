"""The fleet exchange's share of endpoint scrapes (see `extproc.endpoints.shared_metrics` for why and the wire
form of one scrape).

Each replica publishes its own recent scrapes (`<wall time> <JSON {address: [sequence, scrape..., in flight]}>`, one
more field of the fleet hash next to its in-flight counts, written in the same script call) and adopts the other
replicas' newer ones as if it had scraped them itself. "In flight" is the replicas' in-flight count at the endpoint
when the scrape was taken, as the publisher knew it (`Endpoint.in_flight_at_scrape`): the adopter counts what the
replicas sent and what ended since from it (`LoadModel.sent_since`), exactly as after its own scrape. (Counting
from the adopter's own count at adoption, as before, missed every request that ended or was sent between the
scrape and its adoption, up to an interval plus two exchanges, and the others' since: flow control saw a full pool
with seats free.) An entry without it (an older replica's) is adopted with the adopter's count at adoption.
The scraper asks `should_scrape` before each scrape: an endpoint another live replica owns is skipped while a
copy younger than `fallback_s` is at hand.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Mapping

from extproc.endpoints import Endpoint, EndpointMetrics, EndpointRegistry
from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.shared_metrics import FIELDS as _FIELDS
from extproc.endpoints.shared_metrics import decode, encode, owner

__all__ = ["SCRAPES_SUFFIX", "ScrapeShare"]

_log = logging.getLogger(__name__)

SCRAPES_SUFFIX = "/scrapes"  # a replica's field for its scrapes: its id and this suffix
_MAX_PAYLOAD = 1 << 20  # bytes of one replica's published scrapes read at most
_MAX_IN_FLIGHT = 1 << 24  # a published in-flight count above this is malformed


class ScrapeShare:
    def __init__(self, endpoints: EndpointRegistry, replica_id: str, fallback_s: float, *,
                 saturation: Callable[[], SaturationConfig] = SaturationConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`fallback_s`: scrape an endpoint oneself when no copy younger than this is at hand; `clock`: the
        scraper's (metrics are stamped on it)."""
        self._endpoints = endpoints
        self.replica_id = replica_id
        self.field = replica_id + SCRAPES_SUFFIX
        self._fallback_s = fallback_s
        self._saturation = saturation
        self._clock = clock
        self._sequence = 0
        # address -> (sequence, own latest scrape, the replicas' in-flight count there when it was taken)
        self._mine: dict[str, tuple[int, EndpointMetrics, int]] = {}
        self._adopted: dict[str, tuple[str, int]] = {}  # address -> (publishing field, sequence) last adopted
        # The payload last built (republished as is until a new scrape or an expiry: its stamp dates its ages) and
        # each other replica's value last read (the same bytes again need no parsing): both every exchange else.
        self._payload: str | None = None
        self._seen: dict[str, bytes] = {}
        self._live: Collection[str] = (replica_id,)
        self.adopted_total = 0
        self.skipped_total = 0

    def live(self, replicas: Collection[str]) -> None:
        """The replicas heard from lately, this one included: they share the endpoints between them."""
        self._live = replicas

    def scraped(self, endpoint: Endpoint, metrics: EndpointMetrics) -> None:
        """This replica scraped `endpoint` (published at the next exchange), after `endpoint.scraped`."""
        self._sequence += 1
        self._mine[endpoint.address] = (self._sequence, metrics, endpoint.in_flight_at_scrape)
        self._payload = None

    def should_scrape(self, endpoint: Endpoint) -> bool:
        if len(self._live) < 2 or owner(endpoint.address, self._live) == self.replica_id:
            return True
        metrics = endpoint.metrics
        if metrics is None or self._clock() - metrics.scraped_at > self._fallback_s:
            return True
        self.skipped_total += 1
        return False

    def payload(self, now: float, stale_after_s: float) -> str | None:
        """This replica's scrapes younger than `stale_after_s`, stamped with wall time `now` (None: none)."""
        mono = self._clock()
        if any(mono - m.scraped_at > stale_after_s for _, m, _ in self._mine.values()):
            self._mine = {a: m for a, m in self._mine.items() if mono - m[1].scraped_at <= stale_after_s}
            self._payload = None
        if self._payload is None and self._mine:
            items = {a: [seq, *encode(m, mono - m.scraped_at), count] for a, (seq, m, count) in self._mine.items()}
            self._payload = f"{now:.3f} {json.dumps(items, separators=(',', ':'))}"
        return self._payload

    def adopt(self, published: Mapping[str, bytes], now: float) -> int:
        """Adopt the other replicas' scrapes (field -> value) that are newer than what each endpoint has; `now`:
        wall time (a value's age is its delay since publication, never negative). Returns the scrapes adopted."""
        by_address = {e.address: e for e in self._endpoints.endpoints()}
        mono = self._clock()
        adopted = 0
        self._seen = {field: raw for field, raw in self._seen.items() if field in published}
        for field, raw in published.items():
            if len(raw) > _MAX_PAYLOAD or self._seen.get(field) == raw:
                continue
            self._seen[field] = raw
            try:
                stamp, _, body = raw.decode().partition(" ")
                delay = max(0.0, now - float(stamp))
                items = json.loads(body)
            except ValueError as exc:
                _log.debug("ignoring shared scrapes of %s: %s", field, exc)
                continue
            if not isinstance(items, dict):
                continue
            for address, item in items.items():
                endpoint = by_address.get(address)
                if endpoint is None or not isinstance(item, list) or not item or type(item[0]) is not int:
                    continue
                if self._adopted.get(address) == (field, item[0]):
                    continue  # the same scrape, published again
                try:
                    metrics = decode(item[1:_FIELDS + 1], mono - delay)
                    in_flight = _in_flight(item[_FIELDS + 1:], endpoint)
                except ValueError as exc:
                    _log.debug("ignoring a shared scrape of %s from %s: %s", address, field, exc)
                    continue
                self._adopted[address] = (field, item[0])
                current = endpoint.metrics
                if current is None or metrics.scraped_at > current.scraped_at:
                    endpoint.scraped(metrics, in_flight, self._saturation())
                    adopted += 1
        self.adopted_total += adopted
        return adopted


def _in_flight(rest: list[object], endpoint: Endpoint) -> int:
    """The replicas' in-flight count at a shared scrape (what follows its fields); an older replica's entry has
    none: the adopter's count now stands for it. Raises ValueError on anything but one count in bounds."""
    if not rest:
        return endpoint.fleet_in_flight
    count = rest[0]
    if len(rest) != 1 or type(count) is not int or not 0 <= count <= _MAX_IN_FLIGHT:
        raise ValueError(f"expected one in-flight count 0..{_MAX_IN_FLIGHT} after the scrape, got {rest[:2]!r}")
    return count
