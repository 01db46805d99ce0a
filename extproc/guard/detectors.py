"""Built-in detectors: a regular expression, plus a check of each match where the format has one (card
numbers: Luhn; Chinese resident IDs: ISO 7064 MOD 11-2; phone numbers: 9 to 15 digits).

Every pattern does bounded work per position: a look-behind rejects positions inside a run of the same
characters and every repeat has an upper bound, so a scan is linear in the text (no catastrophic
backtracking on hostile input). Patterns start with a character class and check the character before
it with a look-behind placed after it: the regex engine then skips to candidate characters in C instead
of trying every position (2-5x faster on prose than a leading look-behind).
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
    # A cheap test every match needs (a character, a word): text without it is not scanned at all.
    possible: Callable[[str], bool] | None = None


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
    return 9 <= len(_digits(text)) <= 15 and (text[0] != "+" or text[1].isdigit())


def _ipv4_ok(text: str) -> bool:
    return all(int(octet) <= 255 and (octet == "0" or octet[0] != "0") for octet in text.split("."))

_DIGIT = re.compile(r"\d")


def _has_digit(text: str) -> bool:
    return _DIGIT.search(text) is not None


def _injection_possible(text: str) -> bool:
    """A word every branch of the pattern needs (ignore/disregard/forget + previous/prior/...; reveal;
    you ... now ... DAN/developer)."""
    lowered = text.lower()
    return (any(w in lowered for w in ("ignore", "disregard", "forget"))
            and any(w in lowered for w in ("previous", "prior", "above", "earlier", "preceding"))) or (
        "reveal" in lowered) or ("you" in lowered and "now" in lowered and ("dan" in lowered or "developer" in lowered))


BUILTIN: dict[str, BuiltinDetector] = {
    "email": BuiltinDetector(re.compile(
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}"
        r"\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"), None, lambda text: "@" in text),
    "phone": BuiltinDetector(re.compile(r"[+\d](?<![\w+].)[\d ().-]{7,21}\d(?!\w)"), _phone_ok, _has_digit),
    "credit_card": BuiltinDetector(re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?!\d)"), luhn_ok, _has_digit),
    "ipv4": BuiltinDetector(re.compile(r"\d(?<![\d.]\d)\d{0,2}(?:\.\d{1,3}){3}(?!\.?\d)"), _ipv4_ok,
                            lambda text: "." in text and _has_digit(text)),
    "us_ssn": BuiltinDetector(re.compile(
        r"\d(?<![\d-]\d)\d\d(?<!000)(?<!666)(?<!9\d\d)-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"),
        None, lambda text: "-" in text and _has_digit(text)),
    "cn_resident_id": BuiltinDetector(re.compile(r"[1-9](?<![\dXx][1-9])\d{16}[\dXx](?![\dXx])"), resident_id_ok,
                                      _has_digit),
    # A tripwire for the best-known phrasings, not a defence: rephrasing evades any fixed list.
    "prompt_injection": BuiltinDetector(re.compile(
        r"\b(?:ignore|disregard|forget)\s{1,8}(?:all\s{1,8}|any\s{1,8})?(?:of\s{1,8})?(?:the\s{1,8}|your\s{1,8})?"
        r"(?:previous|prior|above|earlier|preceding)\s{1,8}(?:instructions|prompts|rules|directions)\b"
        r"|\breveal\s{1,8}(?:your|the)\s{1,8}(?:system\s{1,8}prompt|hidden\s{1,8}instructions)\b"
        r"|\byou\s{1,8}are\s{1,8}now\s{1,8}(?:DAN\b|in\s{1,8}developer\s{1,8}mode)", re.IGNORECASE),
        None, _injection_possible),
}
