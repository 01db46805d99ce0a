from __future__ import annotations

import pytest

from extproc.sim.kvcache import BlockTable, KVCache


def table(kv: KVCache, blocks: list[int | None]) -> BlockTable:
    held = BlockTable()
    assert kv.grow(held, blocks)
    return held


def test_shared_hashed_blocks_are_counted_once() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    first = table(kv, [1, 2, 3, None])
    assert kv.used_blocks == 4 and first.size == 4
    second = table(kv, [1, 2, 9])
    assert kv.used_blocks == 5  # blocks 1 and 2 are shared
    kv.release(first)
    assert kv.used_blocks == 3 and first.size == 0
    kv.release(second)
    assert kv.used_blocks == 0 and kv.cached_blocks == 4 and kv.free_blocks == 10


def test_cached_prefix_stops_at_the_first_missing_block() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    kv.release(table(kv, [1, 2, 3]))
    assert kv.cached_prefix([1, 2, 3]) == 3
    assert kv.cached_prefix([1, 5, 3]) == 1


def test_a_table_grows_step_by_step() -> None:
    kv = KVCache(num_blocks=10, block_size=16)
    held = table(kv, [1, 2])
    assert kv.grow(held, [3])
    assert kv.grow(held, [None, None])
    assert held.hashed == [1, 2, 3] and held.anonymous == 2 and kv.used_blocks == 5


def test_released_blocks_are_evicted_lru_tail_first() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    kv.release(table(kv, [1, 2]))  # evictable order: 2 (tail) then 1
    kv.release(table(kv, [7, 8]))  # evictable order: 2, 1, 8, 7
    table(kv, [None])  # needs one physical block: evicts block 2, the tail of the oldest chain
    assert kv.cached_prefix([1, 2]) == 1
    assert kv.cached_prefix([7, 8]) == 2
    table(kv, [None, None])  # evicts 1 and 8
    assert kv.cached_prefix([1]) == 0 and kv.cached_prefix([7, 8]) == 1


def test_growth_fails_without_free_capacity_and_changes_nothing() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    held = table(kv, [1, 2, 3])
    other = BlockTable()
    assert not kv.grow(other, [5, 6])
    assert other.size == 0 and kv.used_blocks == 3 and kv.cached_blocks == 3
    assert kv.grow(other, [1, 2, 3, None])  # shares three, needs one more
    assert kv.usage == 1.0
    assert not kv.grow(held, [None])


def test_reviving_a_cached_block_counts_against_capacity() -> None:
    kv = KVCache(num_blocks=3, block_size=16)
    kv.release(table(kv, [1, 2]))
    hold = table(kv, [None, None])  # evicts 2 (tail); 1 stays cached
    assert kv.cached_prefix([1]) == 1
    assert not kv.grow(BlockTable(), [1, 4])  # reviving 1 plus a new block needs 2 of the 1 free
    kv.release(hold)
    assert kv.grow(BlockTable(), [1, 4])


def test_filled_blocks_become_cached_on_release() -> None:
    kv = KVCache(num_blocks=8, block_size=16)
    held = table(kv, [1, None, None])
    kv.release(held, filled_hashes=[11, 12])
    assert kv.cached_prefix([1, 11, 12]) == 3
    assert kv.used_blocks == 0
    again = table(kv, [1, None])
    with pytest.raises(ValueError):
        kv.release(again, filled_hashes=[11, 12])


def test_reset_drops_only_unreferenced_blocks() -> None:
    kv = KVCache(num_blocks=8, block_size=16)
    kv.release(table(kv, [1, 2]))
    table(kv, [3])
    assert kv.reset() == 2
    assert kv.cached_prefix([1]) == 0 and kv.cached_prefix([3]) == 1
    assert kv.used_blocks == 1
