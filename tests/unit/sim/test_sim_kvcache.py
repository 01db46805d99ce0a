from __future__ import annotations

import pytest

from extproc.sim.kvcache import KVCache


def test_first_allocation_misses_and_second_hits_while_shared() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    first = kv.allocate([1, 2, 3], total_blocks=4, max_hit_blocks=3)
    assert first is not None and first.hit_blocks == 0 and first.anonymous == 1
    assert kv.used_blocks == 4
    second = kv.allocate([1, 2, 9], total_blocks=3, max_hit_blocks=3)
    assert second is not None and second.hit_blocks == 2
    # Shared blocks 1 and 2 are counted once: 4 + block 9.
    assert kv.used_blocks == 5
    kv.release(first)
    assert kv.used_blocks == 3  # blocks 1, 2 still referenced by the second request, plus 9
    kv.release(second)
    assert kv.used_blocks == 0 and kv.cached_blocks == 4


def test_hits_stop_at_the_first_missing_block_and_at_the_cap() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    a = kv.allocate([1, 2, 3], 3, 3)
    assert a is not None
    kv.release(a)
    assert kv.cached_prefix([1, 2, 3]) == 3
    assert kv.cached_prefix([1, 5, 3]) == 1
    capped = kv.allocate([1, 2, 3], 3, max_hit_blocks=2)
    assert capped is not None and capped.hit_blocks == 2


def test_released_blocks_are_evicted_lru_tail_first() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    a = kv.allocate([1, 2], 2, 2)
    assert a is not None
    kv.release(a)  # evictable order: 2 (tail) then 1
    b = kv.allocate([7, 8], 2, 2)
    assert b is not None
    kv.release(b)  # evictable order: 2, 1, 8, 7
    c = kv.allocate([], 1, 0)  # needs one physical block: evicts block 2, the tail of the oldest chain
    assert c is not None
    assert kv.cached_prefix([1, 2]) == 1
    assert kv.cached_prefix([7, 8]) == 2
    d = kv.allocate([], 2, 0)  # evicts 1 and 8
    assert d is not None
    assert kv.cached_prefix([1]) == 0 and kv.cached_prefix([7, 8]) == 1


def test_allocation_fails_without_free_capacity_and_changes_nothing() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    held = kv.allocate([1, 2, 3], 3, 3)
    assert held is not None
    assert kv.allocate([5, 6], 2, 2) is None
    assert kv.used_blocks == 3 and kv.cached_blocks == 3
    fits = kv.allocate([1, 2, 3], 4, 3)  # shares three, needs one more
    assert fits is not None and fits.hit_blocks == 3
    assert kv.usage == 1.0


def test_reviving_a_cached_block_counts_against_capacity() -> None:
    kv = KVCache(num_blocks=3, block_size=16)
    a = kv.allocate([1, 2], 2, 2)
    assert a is not None
    kv.release(a)
    hold = kv.allocate([], 2, 0)  # evicts 2 (tail); 1 stays cached
    assert hold is not None and kv.cached_prefix([1]) == 1
    assert kv.allocate([1, 4], 2, 2) is None  # reviving 1 plus a new block needs 2 of the 1 free
    kv.release(hold)
    again = kv.allocate([1, 4], 2, 2)
    assert again is not None and again.hit_blocks == 1


def test_filled_blocks_become_cached_on_release() -> None:
    kv = KVCache(num_blocks=8, block_size=16)
    a = kv.allocate([1], total_blocks=3, max_hit_blocks=1)
    assert a is not None and a.anonymous == 2
    kv.release(a, filled_hashes=[11, 12])
    assert kv.cached_prefix([1, 11, 12]) == 3
    assert kv.used_blocks == 0
    with pytest.raises(ValueError):
        b = kv.allocate([1], 2, 1)
        assert b is not None
        kv.release(b, filled_hashes=[11, 12])


def test_reset_drops_only_unreferenced_blocks() -> None:
    kv = KVCache(num_blocks=8, block_size=16)
    a = kv.allocate([1, 2], 2, 2)
    b = kv.allocate([3], 1, 1)
    assert a is not None and b is not None
    kv.release(a)
    assert kv.reset() == 2
    assert kv.cached_prefix([1]) == 0 and kv.cached_prefix([3]) == 1
    assert kv.used_blocks == 1
