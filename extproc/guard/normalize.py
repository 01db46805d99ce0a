"""The text detectors read: Unicode-normalised so that look-alike spellings cannot slip past a rule.

- Invisible characters are removed: zero-width space/joiners, word joiner, soft hyphen, byte order mark,
  bidirectional controls, variation selectors, Hangul fillers, Mongolian vowel separator. "ig<ZWSP>nore"
  reads "ignore".
- Unicode tag characters (U+E0020-U+E007E, invisible, yet read by some models: "ASCII smuggling") become
  the ASCII characters they mirror; the other tag characters are removed.
- NFKC folds compatibility forms: full-width letters (U+FF49 for "i"), ligatures, circled and styled
  letters (mathematical bold/italic), superscript digits.

Not folded: case (rules choose `ignore_case`), and cross-script confusables (Cyrillic U+043E for Latin "o"),
which NFKC keeps distinct. ASCII text is returned as is (nothing to fold), so plain prompts cost one check.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["normalize"]

_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\U000e0000-\U000e001f\U000e007f\U000e0100-\U000e01ef]")
_TAGS = re.compile("[\U000e0020-\U000e007e]")


def _untag(match: re.Match[str]) -> str:
    return chr(ord(match.group()) - 0xE0000)


def normalize(text: str) -> str:
    """`text` as the detectors see it (see the module docstring)."""
    if text.isascii():
        return text
    if _INVISIBLE.search(text) is not None:
        text = _INVISIBLE.sub("", text)
    if _TAGS.search(text) is not None:
        text = _TAGS.sub(_untag, text)
    return unicodedata.normalize("NFKC", text)
