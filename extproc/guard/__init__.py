"""Content guard: refuse requests whose prompt matches a deny rule, mask what mask rules match (e.g. PII)
before any model sees it. Runs on the parsed request body the service already holds; the masked body
replaces the original (as an alias rewrite does). Opt-in: no rules, no work.

It reads every field vLLM renders into the prompt (extproc/openai/prompt.py), normalised (normalize.py).
Deny rules run once over all of it joined with newlines, so a phrase split across parts or messages is
found; masks run on each string (a value split across strings is not masked) and a string with a match
is replaced by its normalised, masked form."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from extproc.guard.config import DETECTORS, GuardConfig, GuardRule
from extproc.guard.detectors import BUILTIN
from extproc.guard.normalize import normalize
from extproc.openai.errors import ApiError
from extproc.openai.prompt import prompt_slots, prompt_text, unreadable_prompt
from extproc.openai.spec import Api, InferenceRequest

__all__ = ["DETECTORS", "Guard", "GuardConfig", "GuardRule", "Screened", "refused", "unverifiable"]


def refused(rule: str) -> ApiError:
    return ApiError(400, f"The request was refused by the gateway's content policy (rule '{rule}').",
                    "invalid_request_error", "content_policy_violation")


def unverifiable(field: str) -> ApiError:
    return ApiError(400, f"The gateway's content policy screens prompt text; '{field}' carries prompt tokens it "
                         "cannot read (send text instead).", "invalid_request_error", "content_policy_unverifiable",
                    field)


def too_long(limit: int) -> ApiError:
    return ApiError(413, f"The prompt text exceeds the content guard's limit of {limit} characters.",
                    "invalid_request_error", "request_too_large")


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None
    deny: bool
    mask_text: str
    template: str  # mask_text as an re.sub template (its backslashes escaped)
    possible: Callable[[str], bool] | None = None

    def hits(self, text: str) -> bool:
        if self.possible is not None and not self.possible(text):
            return False
        return any(self.valid is None or self.valid(m.group()) for m in self.pattern.finditer(text))

    def mask(self, text: str) -> tuple[str, int]:
        if self.possible is not None and not self.possible(text):
            return text, 0
        if self.valid is None:  # a template string is substituted in C, a callback per match is not
            return self.pattern.subn(self.template, text)
        valid, count = self.valid, 0

        def replace(match: re.Match[str]) -> str:
            nonlocal count
            if not valid(match.group()):
                return match.group()
            count += 1
            return self.mask_text

        return self.pattern.sub(replace, text), count


def _compile(rule: GuardRule) -> _Rule:
    if rule.detector is not None:
        builtin = BUILTIN[rule.detector]
        pattern, valid, possible = builtin.pattern, builtin.valid, builtin.possible
        if rule.ignore_case and not pattern.flags & re.IGNORECASE:
            pattern = re.compile(pattern.pattern, pattern.flags | re.IGNORECASE)
    else:
        assert rule.pattern is not None  # the config validator requires one of the two
        pattern, valid, possible = re.compile(rule.pattern, re.IGNORECASE if rule.ignore_case else 0), None, None
    return _Rule(rule.name, pattern, valid, rule.action == "deny", rule.mask_text,
                 rule.mask_text.replace("\\", "\\\\"), possible)


@dataclass
class Screened:
    """What the guard found in one request: the deny rule that refuses it, or the matches masked (in
    place) per rule name."""

    denied_by: str | None = None
    masked: dict[str, int] = field(default_factory=dict)


class Guard:
    """The compiled rules of one policy (built with the routing snapshot)."""

    def __init__(self, config: GuardConfig) -> None:
        rules = [_compile(rule) for rule in config.rules]
        self._deny = [r for r in rules if r.deny]
        self._mask = [r for r in rules if not r.deny]
        self._tiers = frozenset(config.tiers)
        self.max_text_chars = config.max_text_chars

    def applies_to(self, tier: str) -> bool:
        return not self._tiers or tier in self._tiers

    def screen(self, api: Api, document: dict[str, Any]) -> Screened:
        """The first deny rule that matches the prompt's joined text, else every mask applied in place.
        Text over the bound (ApiError 413) or prompt tokens it cannot read (token ids, embeddings: 400) are
        refused, never passed on unscreened."""
        unreadable = unreadable_prompt(api, document)
        if unreadable is not None:
            raise unverifiable(unreadable)
        texts, meta = prompt_slots(api, document)
        slots = texts + meta
        raw = [key if container is None else container[key] for container, key in slots]
        if sum(map(len, raw)) > self.max_text_chars:
            raise too_long(self.max_text_chars)
        seen = [normalize(text) for text in raw]
        if self._deny:
            # What the prompt says as one text, as the template joins it (a phrase split over parts or
            # messages is still found), then what structures it.
            joined = "\n".join(seen)
            for rule in self._deny:
                if rule.hits(joined):
                    return Screened(denied_by=rule.name)
        screened = Screened()
        for (container, key), text in zip(slots, seen, strict=True):
            if container is None:
                continue  # a dict key (e.g. a tool's parameter name): screened by deny rules only
            masked_any = False
            for rule in self._mask:
                text, count = rule.mask(text)
                if count:
                    masked_any = True
                    screened.masked[rule.name] = screened.masked.get(rule.name, 0) + count
            if masked_any:
                container[key] = text
        return screened

    def apply(self, request: InferenceRequest,
              count: Callable[[str, str, int], None] | None = None) -> InferenceRequest | None:
        """Screen `request`: raises the refusal (after `count(rule, "deny", 1)`) if a deny rule matches;
        returns the request with its masked body and prompt text if anything was masked, else None."""
        screened = self.screen(request.api, request.document)
        if screened.denied_by is not None:
            if count is not None:
                count(screened.denied_by, "deny", 1)
            raise refused(screened.denied_by)
        if not screened.masked:
            return None
        if count is not None:
            for rule, matches in screened.masked.items():
                count(rule, "mask", matches)
        return replace(request, prompt_text=prompt_text(request.api, request.document))
