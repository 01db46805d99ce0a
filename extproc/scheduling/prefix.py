"""Chained block hashes of a prompt, the same in every process (no per-process hash seeds).

vLLM caches KV in blocks of 16 tokens keyed by a hash chained over all previous blocks, so two
prompts share cache exactly as far as their block chains agree. Without a tokenizer we cut the
prompt into blocks of `block_chars` characters (~16 tokens at ~4 characters per token): block
boundaries then move with the text the same way token blocks do for a shared prefix. CRC-32 chains
natively (crc32(block, previous) is the CRC of the whole prefix) and runs in C.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256
# PrefixChains' bounds: text held (its keys), the shortest cut worth remembering, how many messages back it looks.
DEFAULT_MEMO_BYTES = 8 << 20
MIN_CUT_BLOCKS = 8
CUT_DEPTH = 3
# How far from its end a prompt longer than its chain is searched for the last message's start (a search of the
# whole rest of a 200 KB prompt costs ~65 us, 16 KB ~5 us; a question after a long document is found at once).
LAST_MESSAGE_CHARS = 16_384


def prefix_blocks(text: str, block_chars: int = DEFAULT_BLOCK_CHARS,
                  max_blocks: int = DEFAULT_MAX_BLOCKS) -> tuple[int, ...]:
    """Hashes of the first `max_blocks` full blocks; hash i covers characters [0, (i+1) * block_chars).
    Per block: one slice and one CRC call (256 blocks: ~55 us measured, about half of it in zlib)."""
    usable = min(len(text) // block_chars, max_blocks) * block_chars
    data = text[:usable].encode("utf-8", "surrogatepass")
    crc = zlib.crc32
    hashes: list[int] = []
    append = hashes.append
    current = 0
    if len(data) == usable:  # ASCII: blocks of bytes
        for start in range(0, usable, block_chars):
            current = crc(data[start:start + block_chars], current)
            append(current)
    else:  # non-ASCII: cut on characters, then encode each block
        for start in range(0, usable, block_chars):
            current = crc(text[start:start + block_chars].encode("utf-8", "surrogatepass"), current)
            append(current)
    return tuple(hashes)


class PrefixChains:
    """`prefix_blocks` for one scheduler, remembering the chains of prompts' leading messages: requests that share
    them (a system prompt, a conversation's history) hash only what follows (15 KB prompts sharing a 13 KB system
    prompt: 60 -> 21 us per request, reports/i15-s11). Same hashes as `prefix_blocks`, always.

    Where a prompt may be cut: before each of its last `CUT_DEPTH` messages (`separator` starts a message), rounded
    down to a whole block; and, when the chain ends (`max_blocks`) before the last message starts (within
    `LAST_MESSAGE_CHARS` of the prompt's end), at its end (a long document or history followed by a new question:
    the whole chain, nothing hashed). The longest cut
    remembered is used; the longest cut is remembered. A
    chain is remembered under its text's exact bytes: a hit is the same text, never a likely one (a hostile prompt
    can only miss). ASCII prompts only (others are cut on characters); at most `max_bytes` of text held, least
    recently used out."""

    __slots__ = ("_chains", "block_chars", "held", "hits", "max_blocks", "max_bytes", "separator")

    def __init__(self, separator: str, block_chars: int = DEFAULT_BLOCK_CHARS, max_blocks: int = DEFAULT_MAX_BLOCKS,
                 max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        self.separator = separator
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.max_bytes = max_bytes
        self._chains: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self.held = 0  # bytes of text held as keys
        self.hits = 0

    def __call__(self, text: str) -> tuple[int, ...]:
        block = self.block_chars
        usable = min(len(text) // block, self.max_blocks) * block
        shortest = MIN_CUT_BLOCKS * block
        if usable < shortest or not text.isascii():
            return prefix_blocks(text, block, self.max_blocks)
        data = text[:usable].encode()
        cuts: list[int] = []
        end = usable
        if len(text) > usable and text.rfind(self.separator, max(usable, len(text) - LAST_MESSAGE_CHARS)) >= 0:
            cuts.append(usable)  # the chain stops inside an earlier message: the next turn's chain is this one
        while len(cuts) < CUT_DEPTH and (end := text.rfind(self.separator, 0, end)) >= shortest:
            cuts.append(end // block * block)
        chains = self._chains
        known: tuple[int, ...] = ()
        for cut in cuts:
            key = data[:cut]
            found = chains.get(key)
            if found is not None:
                chains.move_to_end(key)
                known = found
                self.hits += 1
                break
        hashes = list(known)
        append, crc = hashes.append, zlib.crc32
        current = known[-1] if known else 0
        for start in range(len(known) * block, usable, block):
            current = crc(data[start:start + block], current)
            append(current)
        if cuts and len(known) * block < cuts[0]:
            self._remember(data[:cuts[0]], tuple(hashes[:cuts[0] // block]))
        return tuple(hashes)

    def _remember(self, key: bytes, chain: tuple[int, ...]) -> None:
        chains = self._chains
        if key in chains:
            return
        chains[key] = chain
        self.held += len(key)
        while self.held > self.max_bytes:
            oldest, _ = chains.popitem(last=False)
            self.held -= len(oldest)


def token_blocks(token_ids: list[int], block_size: int = 16, max_blocks: int = DEFAULT_MAX_BLOCKS) -> tuple[int, ...]:
    """The same chain over real token ids (when a tokenizer is configured)."""
    hashes = []
    current = 0
    for start in range(0, min(len(token_ids) // block_size, max_blocks) * block_size, block_size):
        block = token_ids[start:start + block_size]
        current = zlib.crc32(b"".join(t.to_bytes(4, "little", signed=False) for t in block), current)
        hashes.append(current)
    return tuple(hashes)


def rendezvous(key: int, address: str) -> int:
    """Highest-random-weight hash of (key, endpoint): the same ranking in every replica."""
    return zlib.crc32(address.encode(), key) * 2654435761 % (1 << 32)
