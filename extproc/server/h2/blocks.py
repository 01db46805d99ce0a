"""Header blocks of the lean front end, decoded once per distinct block (RFC 7541).

Envoy opens every ext_proc stream with the same header block: `:path` as a literal that is not indexed, the rest
indexed (seen on Envoy 1.40: `83 04 95 ... c2 86 c1 c0 bf be`). Decoding it again each time (hpack is pure
Python, `:path` Huffman-coded) cost about 9% of the service's CPU at 200 req/s (reports/hotpath-s10). A block made
only of indexed fields and literals that are not indexed leaves the dynamic table as it was, so the same bytes
decode to the same headers for as long as no other block changed the table: such blocks are remembered (at most
`MAX_CACHED`), and any block that may change the table (a literal with indexing, a table size update) empties
the memory. Every block still goes through the decoder the first time, with its bounds.
"""

from __future__ import annotations

from typing import Any

from hpack import Decoder

__all__ = ["BlockDecoder", "table_neutral"]

MAX_CACHED = 32


def _integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 5.1) at `at`: its value and the offset after it. IndexError if cut short."""
    mask = (1 << prefix_bits) - 1
    value = block[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    while True:
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 28:
            raise IndexError("an integer over 2^28")


def table_neutral(block: bytes) -> bool:
    """Whether decoding `block` leaves the dynamic table unchanged: indexed fields (6.1) and literals without
    indexing or never indexed (6.2.2, 6.2.3) only, well formed to the last byte."""
    at, size = 0, len(block)
    try:
        while at < size:
            first = block[at]
            if first & 0x80:
                _, at = _integer(block, at, 7)
            elif first & 0xE0 == 0:  # 0000xxxx or 0001xxxx
                index, at = _integer(block, at, 4)
                if index == 0:  # a literal name
                    length, at = _integer(block, at, 7)
                    at += length
                length, at = _integer(block, at, 7)
                at += length
            else:  # 01xxxxxx adds to the table, 001xxxxx resizes it
                return False
    except IndexError:
        return False
    return at == size


class BlockDecoder:
    def __init__(self, max_header_list_size: int) -> None:
        self.decoder = Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self.cached: dict[bytes, list[Any]] = {}
        self.hits = 0

    def decode(self, block: bytes) -> list[Any]:
        """The (name, value) pairs of `block` as bytes; raises HPACKError as the decoder does."""
        if not table_neutral(block):
            self.cached.clear()
            return list(self.decoder.decode(block, raw=True))
        headers = self.cached.get(block)
        if headers is not None:
            self.hits += 1
            return headers
        headers = list(self.decoder.decode(block, raw=True))
        if len(self.cached) >= MAX_CACHED:
            self.cached.clear()
        self.cached[block] = headers
        return headers
