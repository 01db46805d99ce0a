"""Prompt calibration shared between service replicas through Redis.

Envoy sends its access log over a few long-lived gRPC streams, so some replicas receive most exchanges'
usage and others few or none. The calibration's statistics are sums (`PromptCalibration.export`), so
every `interval_s` each replica publishes its own into one hash (`CALIBRATION_KEY`, field: replica id,
value: wall time + JSON) and adds up the other fresh replicas' (`adopt`): every replica then estimates
from the fleet's fit. Off the request path; a failed exchange keeps the last combined fit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from extproc.gateway.calibration import PromptCalibration
from extproc.limits.cluster import RedisClient
from extproc.limits.resp import ScriptCall
from extproc.server.fleet import ReplicaExchange, exchange_call, other_fields, replica_name

__all__ = ["CALIBRATION_KEY", "CalibrationSync"]

_log = logging.getLogger(__name__)

CALIBRATION_KEY = "calib:prompt"


class CalibrationSync(ReplicaExchange):
    WHAT = "prompt calibration sync"

    def __init__(self, client: RedisClient, calibration: PromptCalibration, interval_s: float = 2.0, *,
                 stale_after_s: float | None = None, replica_id: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(client, interval_s)
        self._calibration = calibration
        self._stale_after_s = stale_after_s if stale_after_s is not None else 5.0 * interval_s
        self.replica_id = replica_id or replica_name()
        self._clock = clock

    def request(self) -> ScriptCall:
        """Publish this replica's sums, read the fleet's."""
        now = self._clock()
        value = f"{now:.3f} {json.dumps(self._calibration.export(), separators=(',', ':'))}"
        return exchange_call(CALIBRATION_KEY, self.replica_id, value, now, self._stale_after_s)

    def settle(self, reply: Any) -> int:
        """Adopt the fleet's sums; returns how many other replicas contributed."""
        others = []
        for field, raw in other_fields(reply, (self.replica_id,)).items():
            try:
                parsed = json.loads(raw.decode().partition(" ")[2])
                if isinstance(parsed, dict):
                    others.append(parsed)
            except (UnicodeDecodeError, ValueError) as exc:
                _log.debug("ignoring calibration entry of %s: %s", field, exc)
        self._calibration.adopt(others)
        return len(others)
