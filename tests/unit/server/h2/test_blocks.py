"""Header blocks decoded once per distinct block (extproc/server/h2/blocks.py): the same answers as a fresh HPACK
decoder for every block of a sequence, including blocks whose bytes mean other headers once the table changed."""

from __future__ import annotations

from hpack import Decoder, Encoder, HPACKError
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.server.h2.blocks import MAX_CACHED, BlockDecoder, table_neutral

ENVOY_BLOCK = bytes.fromhex("8304a560b5773fa5d05b3b98855cbe5315761c8bf7657c1e525b2a1d1aec390a841ec635d8721508"
                            "c286c1c0bfbe")  # the second and later ext_proc streams of Envoy 1.40, as received


def test_indexed_fields_and_literals_without_indexing_are_neutral_the_rest_not() -> None:
    assert table_neutral(ENVOY_BLOCK) and table_neutral(b"\x82\x86\xbe") and table_neutral(b"\xff\x80\x01")
    assert table_neutral(b"\x04\x01/") and table_neutral(b"\x10\x01a\x01b")  # :path not indexed; never indexed
    assert not table_neutral(b"\x44\x01/")  # literal with incremental indexing
    assert not table_neutral(b"\x3f\xe1\x1f")  # dynamic table size update
    assert not table_neutral(b"\x04\x05/")  # a value cut short
    assert not table_neutral(b"\xff")  # an integer cut short


def test_a_repeated_neutral_block_is_decoded_once_and_a_table_change_forgets_it() -> None:
    encoder, ours, reference = Encoder(), BlockDecoder(65_536), Decoder()
    first = encoder.encode([(":method", "POST"), (":path", "/a"), ("x-token", "one")])
    again = encoder.encode([(":method", "POST"), (":path", "/a"), ("x-token", "one")])
    assert not table_neutral(first) and table_neutral(again)
    for block in (first, again, again, again):
        assert ours.decode(block) == list(reference.decode(block, raw=True))
    assert ours.hits == 2
    # The same bytes name other headers once the table has moved on: "be" was x-token: one, now x-other.
    changed = encoder.encode([("x-other", "two")])
    assert ours.decode(changed) == list(reference.decode(changed, raw=True)) and ours.cached == {}
    assert ours.decode(b"\xbe") == list(reference.decode(b"\xbe", raw=True)) == [(b"x-other", b"two")]


def test_the_memory_is_bounded() -> None:
    ours = BlockDecoder(65_536)
    for index in range(3 * MAX_CACHED):
        ours.decode(b"\x04" + bytes((len(str(index)),)) + str(index).encode())
        assert len(ours.cached) <= MAX_CACHED


def test_a_broken_block_fails_as_the_decoder_does() -> None:
    ours = BlockDecoder(65_536)
    for broken in (b"\x80", b"\x04\x85\xff\xff\xff\xff\xff"):  # index 0; bad Huffman
        try:
            ours.decode(broken)
        except HPACKError:
            continue
        raise AssertionError(f"{broken.hex()} decoded")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["x-a", "x-b", ":path", "x-c"]),
                                   st.sampled_from(["1", "2", "/p", ""]), st.booleans()), min_size=1, max_size=4),
                min_size=1, max_size=12))
def test_any_sequence_decodes_as_a_plain_decoder_does(blocks: list[list[tuple[str, str, bool]]]) -> None:
    encoder, ours, reference = Encoder(), BlockDecoder(65_536), Decoder()
    for fields in blocks:
        block = encoder.encode([(name, value, sensitive) for name, value, sensitive in fields])
        assert ours.decode(block) == list(reference.decode(block, raw=True))
    assert ours.decode(ENVOY_BLOCK[:1]) == list(reference.decode(ENVOY_BLOCK[:1], raw=True))
