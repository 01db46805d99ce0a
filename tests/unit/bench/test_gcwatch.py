from __future__ import annotations

import gc

from extproc.bench.gcwatch import GcPauses


def test_collections_inside_the_block_are_recorded_with_their_generation_and_none_after_it() -> None:
    with GcPauses() as pauses:
        gc.collect(2)
    assert any(generation == 2 and ms >= 0 for _, ms, generation in pauses.pauses)
    seen = len(pauses.pauses)
    gc.collect(2)
    assert len(pauses.pauses) == seen
    assert pauses.longest(1)[0]["ms"] == round(max(ms for _, ms, _ in pauses.pauses), 1)
