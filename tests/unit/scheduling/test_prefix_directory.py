"""PrefixDirectory: what `record` reports it held is what `match` says, whatever was recorded, learned or
trimmed before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.scheduling.prefix_directory import PrefixDirectory

# Chains that share prefixes, as prompts do: a step is (base chain, length, endpoint, learned from elsewhere).
_STEPS = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.sampled_from("abcde"), st.booleans()),
                  min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS, capacity=st.integers(5, 40), homes=st.integers(1, 3))
def test_record_reports_the_depth_match_saw_before_it(steps: list[tuple[int, int, str, bool]], capacity: int,
                                                      homes: int) -> None:
    directory = PrefixDirectory(capacity, homes, share_every=4)
    for base, length, address, learned in steps:
        blocks = [base * 1000 + i for i in range(length)]
        if learned:
            directory.learn(blocks[::2], address)
            continue
        before = directory.match(blocks, [address]).get(address, 0)
        held, fresh = directory.record(blocks, address)
        assert held == before
        assert directory.match(blocks, [address]) == {address: length}  # (a chain's last 5 blocks are kept)
        assert set(fresh) <= set(blocks)
        assert len(directory) <= capacity


def test_record_shares_every_fourth_new_block_and_the_last() -> None:
    directory = PrefixDirectory(100, 2, share_every=4)
    assert directory.record(list(range(10)), "a") == (0, [3, 7, 9])
    assert directory.record(list(range(6)), "a") == (6, [])
    assert directory.record([*range(6), 50, 51], "b") == (0, [3, 51])
    assert directory.record([*range(6), 60], "a") == (6, [60])


def test_a_colliding_hash_is_not_taken_for_a_deep_prefix() -> None:
    directory = PrefixDirectory(1000, 8, share_every=4)
    home = list(range(100, 140))  # a system prompt's chain, sent to "home"
    directory.record(home, "home")
    other = list(range(500, 540))
    directory.record(other, "elsewhere")
    # A request on home's prompt whose own last block hashes like a block of another prompt sent elsewhere.
    request = [*home, 9001, 9002, 9003, other[30]]
    assert directory.match(request, ["home", "elsewhere"]) == {"home": 40}
    held, _ = directory.record(request, "home")
    assert held == 40  # record agrees
    # The same request sent elsewhere: "elsewhere" holds nothing of it (its depth-44 hit is not confirmed).
    assert directory.match(request, ["elsewhere"]) == {}
    # A genuine chain learned from another replica (every 4th block and the last) is still found at its depth.
    learned = list(range(700, 710))
    directory.learn([learned[3], learned[7], learned[9]], "peer")
    assert directory.match([*learned, 42], ["peer"]) == {"peer": 10}
