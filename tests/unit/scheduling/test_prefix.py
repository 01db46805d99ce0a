from __future__ import annotations

import subprocess
import sys
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.scheduling.prefix import prefix_blocks, rendezvous, token_blocks


def test_shared_prefix_shares_leading_hashes_only() -> None:
    system = "You are a helpful assistant. " * 20
    a = prefix_blocks(system + "What is the capital of France? " * 9)
    b = prefix_blocks(system + "How do I bake bread properly? " * 9)
    shared = len(system) // 64
    assert a[:shared] == b[:shared]
    assert a[shared + 1] != b[shared + 1]


def test_partial_block_and_limits() -> None:
    assert prefix_blocks("x" * 63) == ()
    assert len(prefix_blocks("x" * 64 * 10, max_blocks=4)) == 4
    assert len(prefix_blocks("é" * 200)) == 3  # cut on characters, not bytes


def test_hashes_are_identical_across_processes() -> None:
    code = "from extproc.scheduling.prefix import prefix_blocks; print(prefix_blocks('abc' * 100))"
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(prefix_blocks("abc" * 100))


def test_token_blocks_and_rendezvous_spread() -> None:
    assert len(token_blocks(list(range(40)))) == 2
    winners = {max(["a:1", "b:1", "c:1", "d:1"], key=lambda a, k=key: rendezvous(k, a)) for key in range(200)}
    assert winners == {"a:1", "b:1", "c:1", "d:1"}


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.sampled_from("ab é\u20ac\U0001f600\ud800"), max_size=700), block=st.integers(1, 70),
       most=st.integers(0, 12))
def test_each_hash_is_the_crc_of_its_whole_prefix(text: str, block: int, most: int) -> None:
    """What the chain means, whatever the text (ASCII or not, lone surrogates included): hash i is the CRC-32 of
    the first (i + 1) blocks of characters, encoded as UTF-8."""
    expected = tuple(zlib.crc32(text[:end].encode("utf-8", "surrogatepass"))
                     for end in range(block, min(len(text) // block, most) * block + 1, block))
    assert prefix_blocks(text, block, most) == expected
