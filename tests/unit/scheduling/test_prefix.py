from __future__ import annotations

import subprocess
import sys
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.scheduling.prefix import PrefixChains, prefix_blocks, rendezvous, token_blocks


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


SEP = "\n<|"


def _chat(*messages: str) -> str:
    return "\n".join(f"<|{'user' if i % 2 else 'system'}|>{m}" for i, m in enumerate(messages))


def test_chains_reuse_a_shared_system_prompt_and_a_growing_conversation() -> None:
    chains = PrefixChains(SEP)
    system = "You are assistant 7. " + "words of the system prompt " * 200
    first = _chat(system, "what is the first question here? " * 30)
    assert chains(first) == prefix_blocks(first) and chains.hits == 0
    second = _chat(system, "and now a different question entirely " * 30)
    assert chains(second) == prefix_blocks(second) and chains.hits == 1  # the system prompt's chain, remembered
    third = _chat(system, "and now a different question entirely " * 30, "an answer " * 40, "next? " * 20)
    assert chains(third) == prefix_blocks(third) and chains.hits == 2  # two messages back: the same history
    assert 0 < chains.held <= len(system) + 20 + len(third)  # two cuts remembered: the system prompt, the history


def test_a_chain_ending_inside_an_earlier_message_is_remembered_whole() -> None:
    """A document longer than the chain (`max_blocks`) and then a question: the next question reuses the whole
    chain (before, only a cut before the last message counted, and here it lies past the chain's end)."""
    chains = PrefixChains(SEP)
    document = "a long shared document line. " * 800  # ~23 KB: the chain (256 blocks of 64) ends inside it
    first = _chat("You are a reader.", document, "first question? " * 10)
    assert chains(first) == prefix_blocks(first) and chains.hits == 0
    assert chains.held == len(prefix_blocks(first)) * 64  # the whole chain's text, under one key
    second = _chat("You are a reader.", document, "a different question " * 10)
    assert chains(second) == prefix_blocks(second) and chains.hits == 1
    alone = _chat("You are a reader.", document)  # the document is the last message: no next turn to wait for
    assert chains(alone) == prefix_blocks(alone) and chains.hits == 1


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(st.text(st.sampled_from("ab <|\n"), max_size=300), min_size=1, max_size=6),
       others=st.lists(st.text(st.sampled_from("ab <|\n\u00e9"), max_size=300), max_size=3),
       block=st.integers(1, 40), most=st.integers(0, 64))
def test_chains_are_prefix_blocks_whatever_the_text(messages: list[str], others: list[str], block: int,
                                                    most: int) -> None:
    """The memo never changes a hash: texts sharing messages (hits), separators inside messages (a hostile prompt
    choosing the cuts), non-ASCII text, tiny blocks and a memo so small it evicts at once."""
    chains = PrefixChains(SEP, block, most, max_bytes=block * 40)
    for end in range(1, len(messages) + 1):
        for tail in ["", *others]:
            text = _chat(*messages[:end], tail) if tail else _chat(*messages[:end])
            assert chains(text) == prefix_blocks(text, block, most)
            assert chains.held <= block * 40


def test_the_memo_is_bounded_and_forgets_the_least_recently_used() -> None:
    chains = PrefixChains(SEP, max_bytes=40_000)
    systems = [f"system prompt number {n} " * 400 for n in range(10)]  # ~10 KB each
    for system in systems:
        chains(_chat(system, "question " * 100))
    assert chains.held <= 40_000
    hits = chains.hits
    chains(_chat(systems[-1], "another question " * 50))
    assert chains.hits == hits + 1  # the most recent is held
    chains(_chat(systems[0], "another question " * 50))
    assert chains.hits == hits + 1  # the oldest was let go
