"""Built-in detectors: a regular expression, plus a check of each match where the format has one (card
numbers: Luhn; Chinese resident IDs: ISO 7064 MOD 11-2; phone numbers: 9 to 15 digits).

Every pattern does bounded work per position: a look-behind rejects positions inside a run of the same
characters and every repeat has an upper bound, so a scan is linear in the text (no catastrophic
backtracking on hostile input).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BUILTIN", "BuiltinDetector", "luhn_ok", "resident_id_ok"]


@dataclass(frozen=True, slots=True)
class BuiltinDetector:
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None = None  # a match is only a hit when this holds


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def luhn_ok(text: str) -> bool:
    digits = _digits(text)
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def resident_id_ok(text: str) -> bool:
    """GB 11643 check character: ISO 7064 MOD 11-2 over the first 17 digits."""
    body, check = text[:17], text[17:].upper()
    total = sum(int(d) * w for d, w in zip(body, _ID_WEIGHTS, strict=True))
    return "10X98765432"[total % 11] == check


def _phone_ok(text: str) -> bool:
    return 9 <= len(_digits(text)) <= 15


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

BUILTIN: dict[str, BuiltinDetector] = {
    "email": BuiltinDetector(re.compile(
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}"
        r"\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")),
    "phone": BuiltinDetector(re.compile(r"(?<![\w+])\+?\d[\d ().-]{7,20}\d(?!\w)"), _phone_ok),
    "credit_card": BuiltinDetector(re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?!\d)"), luhn_ok),
    "ipv4": BuiltinDetector(re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)")),
    "us_ssn": BuiltinDetector(re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")),
    "cn_resident_id": BuiltinDetector(re.compile(r"(?<![\dXx])[1-9]\d{16}[\dXx](?![\dXx])"), resident_id_ok),
    # A tripwire for the best-known phrasings, not a defence: rephrasing evades any fixed list.
    "prompt_injection": BuiltinDetector(re.compile(
        r"\b(?:ignore|disregard|forget)\s{1,8}(?:all\s{1,8}|any\s{1,8})?(?:of\s{1,8})?(?:the\s{1,8}|your\s{1,8})?"
        r"(?:previous|prior|above|earlier|preceding)\s{1,8}(?:instructions|prompts|rules|directions)\b"
        r"|\breveal\s{1,8}(?:your|the)\s{1,8}(?:system\s{1,8}prompt|hidden\s{1,8}instructions)\b"
        r"|\byou\s{1,8}are\s{1,8}now\s{1,8}(?:DAN\b|in\s{1,8}developer\s{1,8}mode)", re.IGNORECASE)),
}
