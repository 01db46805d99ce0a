"""Content guard: refuse requests whose prompt matches a deny rule, mask what mask rules match (e.g. PII)
before any model sees it. Runs on the parsed request body the service already holds; the masked body
replaces the original (as an alias rewrite does). Opt-in: no rules, no work."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from extproc.guard.config import DETECTORS, GuardConfig, GuardRule
from extproc.guard.detectors import BUILTIN
from extproc.openai.errors import ApiError
from extproc.openai.spec import Api, InferenceRequest, prompt_text

__all__ = ["DETECTORS", "Guard", "GuardConfig", "GuardRule", "Screened", "refused"]


def refused(rule: str) -> ApiError:
    return ApiError(400, f"The request was refused by the gateway's content policy (rule '{rule}').",
                    "invalid_request_error", "content_policy_violation")


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


def _slots(api: Api, document: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every prompt text string of the body: chat message contents and text parts,
    completion prompts, embedding inputs (token-id arrays are not text)."""
    if api is Api.CHAT:
        for message in document.get("messages") or ():
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                yield message, "content"
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        yield part, "text"
        return
    key = "prompt" if api is Api.COMPLETIONS else "input"
    value = document.get(key)
    if isinstance(value, str):
        yield document, key
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str):
                yield value, index


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
        """The first deny rule that matches, else every mask applied in place. Text over the bound is
        refused (ApiError 413), never passed on unscreened."""
        slots = list(_slots(api, document))
        if sum(len(container[key]) for container, key in slots) > self.max_text_chars:
            raise too_long(self.max_text_chars)
        for rule in self._deny:
            if any(rule.hits(container[key]) for container, key in slots):
                return Screened(denied_by=rule.name)
        screened = Screened()
        for rule in self._mask:
            for container, key in slots:
                text, count = rule.mask(container[key])
                if count:
                    container[key] = text
                    screened.masked[rule.name] = screened.masked.get(rule.name, 0) + count
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
