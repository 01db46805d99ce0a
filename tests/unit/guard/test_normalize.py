from __future__ import annotations

import pytest

from extproc.guard.normalize import normalize


@pytest.mark.parametrize(("text", "seen"), [
    ("plain ascii stays", "plain ascii stays"),
    ("ig\u200bno\u200dre\u00ad", "ignore"),
    ("\ufeffbom\u2066bidi\u2069", "bombidi"),
    ("\uff49\uff47\uff4e\uff4f\uff52\uff45", "ignore"),  # full-width
    ("\U0001d422\U0001d420\U0001d427", "ign"),  # mathematical bold
    ("\ufb01le", "file"),  # ligature
    ("".join(chr(0xE0000 + ord(c)) for c in "hidden"), "hidden"),  # tag characters ("ASCII smuggling")
    ("caf\u00e9 \u4e2d\u6587", "caf\u00e9 \u4e2d\u6587"),  # ordinary text keeps its letters
])
def test_what_detectors_see(text: str, seen: str) -> None:
    assert normalize(text) == seen


def test_lone_surrogates_do_not_break_it() -> None:
    assert normalize("a\ud800\u200bb") == "a\ud800b"
