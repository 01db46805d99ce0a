"""Chained block hashes of a prompt, the same in every process (no per-process hash seeds).

vLLM caches KV in blocks of 16 tokens keyed by a hash chained over all previous blocks, so two
prompts share cache exactly as far as their block chains agree. Without a tokenizer we cut the
prompt into blocks of `block_chars` characters (~16 tokens at ~4 characters per token): block
boundaries then move with the text the same way token blocks do for a shared prefix. CRC-32 chains
natively (crc32(block, previous) is the CRC of the whole prefix) and runs in C.
"""

from __future__ import annotations

import zlib

DEFAULT_BLOCK_CHARS = 64
DEFAULT_MAX_BLOCKS = 256


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
