"""Policy models of the content guard (mounted as `Policy.guard`): rules that refuse a request or mask
what they match in its prompt before any model sees it."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from extproc.policy_types import RuleName, Strict

__all__ = ["DETECTORS", "Detector", "GuardConfig", "GuardRule"]

# Built-in detectors (extproc/guard/detectors.py); a rule names one or gives its own `pattern`.
Detector = Literal["email", "phone", "credit_card", "ipv4", "us_ssn", "cn_resident_id", "prompt_injection"]
DETECTORS: tuple[str, ...] = get_args(Detector)

class GuardRule(Strict):
    """What to look for (a built-in `detector`, or a Python regular expression `pattern`) and what to do:
    `mask` replaces every match with `replacement` (default "[<NAME>]"), `deny` refuses the request (400
    `content_policy_violation`, naming the rule, never echoing the match)."""

    name: RuleName
    detector: Detector | None = None
    pattern: str | None = Field(default=None, min_length=1, max_length=2000)
    ignore_case: bool = False
    action: Literal["mask", "deny"] = "mask"
    replacement: str | None = Field(default=None, max_length=64)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern does not compile: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> GuardRule:
        if (self.detector is None) == (self.pattern is None):
            raise ValueError(f"guard rule {self.name!r} needs either detector or pattern (exactly one)")
        if self.action == "deny" and self.replacement is not None:
            raise ValueError(f"guard rule {self.name!r}: replacement only applies to action mask")
        return self

    @property
    def mask_text(self) -> str:
        return self.replacement if self.replacement is not None else f"[{self.name.upper()}]"


class GuardConfig(Strict):
    """Rules run on the text of every request of the listed tiers (empty = every tier): chat message
    contents (strings and text parts), completion prompts, embedding inputs. Deny rules first, then masks
    in order. Responses are not inspected (that would put Python on every streamed chunk)."""

    rules: tuple[GuardRule, ...] = ()
    tiers: tuple[str, ...] = ()
    # The scan is linear but runs on the event loop: ~10 ms per rule per 256 Ki characters on a 2-core
    # box. Requests with more prompt text are refused (413), never passed on unscreened.
    max_text_chars: int = Field(default=262_144, ge=1024, le=64 * 1024 * 1024)

    @field_validator("rules")
    @classmethod
    def _unique(cls, value: tuple[GuardRule, ...]) -> tuple[GuardRule, ...]:
        names = [rule.name for rule in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate guard rule names: {duplicates}")
        return value
