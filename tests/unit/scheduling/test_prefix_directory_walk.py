"""PrefixDirectory reads a chain once per decision (`match`, `holders` and `record` share the walk): a differential
test against the straightforward directory that walks the chain block by block on every call (the code it
replaced), over any mix of records, learned placements, trims, chains with repeated hashes and reused chains."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.scheduling.prefix_directory import PrefixDirectory


class WalkingDirectory:
    """The reference: every call walks the chain, block by block."""

    def __init__(self, capacity: int, homes: int, share_every: int) -> None:
        self.capacity, self.homes, self.share_every = capacity, homes, share_every
        self.blocks: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def match(self, blocks: Sequence[int], present: Iterable[str]) -> dict[str, int]:
        wanted = set(present)
        found: dict[str, int] = {}
        for depth in range(len(blocks), 0, -1):
            for address in self.blocks.get(blocks[depth - 1], ()):
                if address in wanted and address not in found:
                    found[address] = depth
        return found

    def holders(self, blocks: Sequence[int], limit: int) -> list[str]:
        found: dict[str, None] = {}
        for depth in range(len(blocks), 0, -1):
            for address in reversed(self.blocks.get(blocks[depth - 1], ())):
                found.setdefault(address)
        return list(found)[:limit]

    def record(self, blocks: Sequence[int], address: str) -> tuple[int, list[int]]:
        fresh: list[int] = []
        held = 0
        for position, block in enumerate(blocks):
            homes = self.blocks.get(block)
            known = homes is not None and address in homes
            if known:
                held = position + 1
            if homes is None or homes[-1] != address:
                self.blocks[block] = self._add(homes or (), address)
            self.blocks.move_to_end(block)
            if not known and ((position + 1) % self.share_every == 0 or position == len(blocks) - 1):
                fresh.append(block)
        self._trim()
        return held, fresh

    def learn(self, hashes: Iterable[int], address: str) -> None:
        for block in hashes:
            homes = self.blocks.get(block)
            if homes is None or address not in homes:
                self.blocks[block] = self._add(homes or (), address)
        self._trim()

    def _add(self, homes: tuple[str, ...], address: str) -> tuple[str, ...]:
        return (*(h for h in homes if h != address), address)[-self.homes:]

    def _trim(self) -> None:
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


# Chains sharing prefixes as prompts do (a base chain cut at some length), or drawn from a few hashes (repeats).
_CHAIN = st.one_of(
    st.tuples(st.integers(0, 3), st.integers(0, 14)).map(lambda c: tuple(c[0] * 1000 + i for i in range(c[1]))),
    st.lists(st.integers(0, 6), max_size=10).map(tuple))
_STEP = st.tuples(st.sampled_from(["record", "record", "learn", "read"]), st.integers(0, 5), st.sampled_from("abcdef"),
                  st.lists(st.sampled_from("abcdefg"), max_size=7), st.integers(1, 8), st.booleans())


@settings(max_examples=300, deadline=None)
@given(chains=st.lists(_CHAIN, min_size=6, max_size=6), steps=st.lists(_STEP, min_size=1, max_size=50),
       capacity=st.integers(3, 40), homes=st.integers(1, 4))
def test_one_walk_answers_as_walking_every_call(chains: list[tuple[int, ...]],
                                                steps: list[tuple[str, int, str, list[str], int, bool]],
                                                capacity: int, homes: int) -> None:
    directory = PrefixDirectory(capacity, homes, share_every=3)
    reference = WalkingDirectory(capacity, homes, share_every=3)
    for action, which, address, present, limit, as_list in steps:
        # The same chain object again and again (a decision's calls share one), sometimes an equal list.
        blocks: Sequence[int] = list(chains[which]) if as_list else chains[which]
        if action == "learn":
            directory.learn(blocks[::2], address)
            reference.learn(blocks[::2], address)
        elif action == "record":
            assert directory.record(blocks, address) == reference.record(blocks, address)
        assert directory.match(blocks, present) == reference.match(blocks, present)
        assert directory.holders(blocks, limit) == reference.holders(blocks, limit)
        assert list(directory._blocks.items()) == list(reference.blocks.items())  # homes and recency alike


def test_a_followed_chain_changes_only_recency() -> None:
    directory = PrefixDirectory(100, 2)
    chain, other = tuple(range(10)), tuple(range(50, 55))
    directory.record(chain, "a")
    directory.record(other, "b")
    homes_before = dict(directory._blocks)
    assert directory.match(chain, ["a", "b"]) == {"a": 10}
    assert directory.record(chain, "a") == (10, [])
    assert dict(directory._blocks) == homes_before
    assert list(directory._blocks)[-10:] == list(chain)  # the followed chain is the most recent again
    assert directory.record(chain, "b") == (0, [3, 7, 9])  # `b` after `a`: now the most recent home
    assert directory.holders(chain, 2) == ["b", "a"]
