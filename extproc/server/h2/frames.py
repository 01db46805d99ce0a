"""HTTP/2 framing and the few HPACK encodings the lean front end needs (RFC 9113, RFC 7541).

Only what a gRPC server owes a gRPC client: frames are parsed by the connection (connection.py); what we send is
built here. Response header blocks use literal fields without indexing, so encoding keeps no state.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x1, 0x2, 0x3, 0x4, 0x5
MAX_HEADER_LIST_SIZE = 0x6
# Error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x2, 0x3, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

_U32 = struct.Struct(">I")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _U32.pack(len(payload))[1:] + bytes((kind, flags)) + _U32.pack(stream) + payload


def settings(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in pairs.items()))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream) + _U32.pack(code))


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK integer representation (RFC 7541 5.1) with `first`'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding (RFC 7541 6.2.2)."""
    return b"\x00" + _integer(len(name), 7, 0) + name + _integer(len(value), 7, 0) + value


STATUS_200 = b"\x88"  # :status 200, static table index 8 (RFC 7541 6.1)
RESPONSE_HEADERS = STATUS_200 + literal(b"content-type", b"application/grpc")


def trailers(status: int, message: str = "") -> bytes:
    """The gRPC status as trailers (a header block for a HEADERS frame ending the stream)."""
    block = literal(b"grpc-status", str(status).encode())
    if message:
        block += literal(b"grpc-message", _percent(message))
    return block


def trailers_only(status: int, message: str = "") -> bytes:
    """A call refused before any response: headers and status in one block."""
    return RESPONSE_HEADERS + trailers(status, message)


def _percent(message: str) -> bytes:
    """grpc-message is percent-encoded outside printable ASCII (and '%')."""
    raw = message.encode()
    return b"".join(bytes((c,)) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)
