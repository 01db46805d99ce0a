"""Pickers: max-score-picker (ties rotate) and random-picker; both return the primary plus fallbacks."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.registry import PluginRegistry, build_params

MAX_SCORE = "max-score-picker"
RANDOM = "random-picker"


@dataclass(frozen=True)
class Params:
    seed: int = 0


class MaxScorePicker:
    """Highest total first; equal totals rotate with the request sequence so idle endpoints share work."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.seed = params.seed

    def pick(self, request: SchedulingRequest, endpoints: Sequence[Endpoint], totals: Sequence[float],
             count: int) -> list[Endpoint]:
        size = len(endpoints)
        start = (request.sequence + self.seed) % size
        rotated = [*range(start, size), *range(start)]  # equal totals: the first from `start` on wins
        rounded = [round(total, 9) for total in totals]
        # nlargest is stable like sorted(reverse=True): equal totals keep the rotation's order.
        return [endpoints[i] for i in heapq.nlargest(count, rotated, key=rounded.__getitem__)]


class RandomPicker:
    """Uniform choice of the primary (a baseline); fallbacks in random order too."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.seed = params.seed

    def pick(self, request: SchedulingRequest, endpoints: Sequence[Endpoint], totals: Sequence[float],
             count: int) -> list[Endpoint]:
        chooser = random.Random(self.seed * 1_000_003 + request.sequence)  # reproducible per request
        return chooser.sample(list(endpoints), min(count, len(endpoints)))


def register(registry: PluginRegistry) -> None:
    registry.register(MAX_SCORE, lambda name, p: MaxScorePicker(name, build_params(Params, name, p)))
    registry.register(RANDOM, lambda name, p: RandomPicker(name, build_params(Params, name, p)))


__all__ = ["MAX_SCORE", "RANDOM", "MaxScorePicker", "RandomPicker", "register"]
