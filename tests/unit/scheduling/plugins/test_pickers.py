from __future__ import annotations

import random

from extproc.scheduling.plugins.pickers import MaxScorePicker
from extproc.scheduling.plugins.pickers import Params as PickerParams
from tests.unit.scheduling.helpers import fleet, request


def test_the_picker_matches_a_full_sort_with_rotating_ties() -> None:
    rng = random.Random(7)
    picker = MaxScorePicker("pick", PickerParams(seed=3))
    for trial in range(300):
        size = rng.randint(1, 40)
        endpoints = fleet(size)
        totals = [rng.choice([0.0, 0.5, 1.0, 2.0, rng.random()]) for _ in range(size)]
        count = rng.randint(1, 5)
        sequence = rng.randint(0, 1000)
        start = (sequence + 3) % size
        order = sorted(range(size), key=lambda i: (-round(totals[i], 9), (i - start) % size))
        expected = [endpoints[i] for i in order[:count]]
        assert picker.pick(request(sequence=sequence), endpoints, totals, count) == expected, trial
