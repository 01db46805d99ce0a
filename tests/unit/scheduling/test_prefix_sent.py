from __future__ import annotations

import math

import pytest

from extproc.scheduling.prefix_sent import MAX_KEYS, Sent

SENT = Sent("10.0.0.1:8000", 17, 3300.0, 300.0, 3000.0, 100.0, True, False, True, 99, 4_000_000_000, (5, 6, 7))


def test_a_line_carries_the_request_and_its_age() -> None:
    parsed = Sent.parse(SENT.line(0.0123))
    assert parsed is not None
    sent, age = parsed
    assert sent == SENT and math.isclose(age, 0.0123, abs_tol=1e-4)
    assert Sent.parse(Sent("a:1", 1, 5.0, 5.0, 0.0, 0.0, False, True, False, None, 2, ()).line(-1.0)) == (
        Sent("a:1", 1, 5.0, 5.0, 0.0, 0.0, False, True, False, None, 2, ()), 0.0)  # no split key, no keys, no age


def test_an_earlier_version_reading_the_line_skips_it() -> None:
    # Earlier replicas read "ADDRESS HASH..." lines: an age with a decimal point is not a hash.
    with pytest.raises(ValueError):
        int(SENT.line(0.0).split()[1])


@pytest.mark.parametrize("line", [
    "", "~", "10.0.0.1:8000 1 2 3",  # not a Sent line
    "~ 1.0 a:1 17 3300 300 3000 100 5 99",  # too short
    "~ x a:1 17 3300 300 3000 100 5 99 4",  # age not a number
    "~ -1.0 a:1 17 3300 300 3000 100 5 99 4", "~ nan a:1 17 3300 300 3000 100 5 99 4",
    "~ 1.0 a:1 17 inf 300 3000 100 5 99 4", "~ 1.0 a:1 17 3300 -300 3000 100 5 99 4",
    "~ 1.0 a:1 17 3300 300 3000 1e12 5 99 4",  # more tokens than any request
    "~ 1.0 a:1 17 3300 300 3000 100 8 99 4",  # unknown flags
    "~ 1.0 a:1 4294967296 3300 300 3000 100 5 99 4", "~ 1.0 a:1 17 3300 300 3000 100 5 -2 4",
    "~ 1.0 a:1 17 3300 300 3000 100 5 99 4 -7",  # hashes are 32-bit, unsigned
    "~ 1.0 a:1 17 3300 300 3000 100 5 99 4 " + " ".join(["1"] * (MAX_KEYS + 1)),  # too many keys
])
def test_a_malformed_line_is_refused(line: str) -> None:
    assert Sent.parse(line) is None
