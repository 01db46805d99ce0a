"""How many tokens the engine may generate for a request, read the way vLLM reads each API's fields.

vLLM (entrypoints/openai/*/protocol.py and serving.py, checked against its main branch):
- chat completions: `max_completion_tokens` if it is not null, else `max_tokens` (older releases used
  `max_completion_tokens or max_tokens`, so a 0 fell through to `max_tokens`); both null = up to the context
  length. `n` sequences (beam width with `use_beam_search`); `best_of` in releases that still had it.
- completions: only `max_tokens` (an absent field is 16, an explicit null is the context length);
  `max_completion_tokens` is not read at all. Every prompt of a batch (`prompt` as a list of strings or of
  token-id lists) is its own request with `n` sequences; `echo` with `max_tokens: 0` still generates 1 token.
- embeddings: nothing is generated.
- Anthropic Messages: `max_tokens` is required and positive; vLLM passes it as both chat fields. No `n`.
- Responses: `max_output_tokens` only (`max_tokens` is not a Responses field); null = up to the context
  length. No `n`.

Our bound must hold under every release's reading, so a chat request is bounded only when both readings are,
and the bound is the larger one. A cap is written so that both readings end at or under it.
"""

from __future__ import annotations

from typing import Any

from extproc.openai.apis import SHAPES, Api
from extproc.openai.errors import ApiError, bad_request

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "OutputBound", "cap_document", "output_bound"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_CHAT_FIELDS = ("max_completion_tokens", "max_tokens")

_SINGLE_FIELD = {Api.COMPLETIONS: "max_tokens", Api.MESSAGES: "max_tokens", Api.RESPONSES: "max_output_tokens"}

OutputBound = tuple[int | None, int]  # (tokens per sequence, None = up to the context length; sequences)


def _optional_int(document: dict[str, Any], name: str, minimum: int = 0) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_request(f"'{name}' must be an integer >= {minimum}", "invalid_value", name)
    return value


def _prompt_count(api: Api, document: dict[str, Any]) -> int:
    """Completions: how many prompts the engine serves separately (a batch), at least 1."""
    if api is not Api.COMPLETIONS:
        return 1
    prompt = document.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)  # strings, or token-id lists
    embeds = document.get("prompt_embeds")
    return len(embeds) if isinstance(embeds, list) and embeds else 1


def output_bound(api: Api, document: dict[str, Any], max_choices: int) -> OutputBound:
    """(per-sequence token bound or None, number of sequences); raises ApiError(400) on invalid fields."""
    if not SHAPES[api].generates:
        return 0, 1
    if api is Api.MESSAGES:
        if document.get("max_tokens") is None:
            raise bad_request("'max_tokens' is required", "invalid_value", "max_tokens")
        return _optional_int(document, "max_tokens", 1), 1
    if api is Api.RESPONSES:
        return _optional_int(document, "max_output_tokens"), 1
    n = _optional_int(document, "n", 1) or 1
    best_of = _optional_int(document, "best_of", 1) or 1
    choices = max(n, best_of)
    if choices > max_choices:
        raise ApiError(400, f"'n' / 'best_of' may be at most {max_choices}", "invalid_request_error",
                       "invalid_value", "n")
    sequences = choices * _prompt_count(api, document)
    if api is Api.COMPLETIONS:
        if "max_tokens" not in document:
            return COMPLETIONS_DEFAULT_MAX_TOKENS, sequences
        tokens = _optional_int(document, "max_tokens")
        if tokens == 0 and document.get("echo") is True:
            tokens = 1
        return tokens, sequences
    completion, tokens = (_optional_int(document, name) for name in _CHAT_FIELDS)
    current = completion if completion is not None else tokens
    legacy = completion or tokens
    if current is None or legacy is None:
        return None, sequences
    return max(current, legacy), sequences


def cap_document(api: Api, document: dict[str, Any], bound: int | None, cap: int) -> bool:
    """Write `cap` into the fields the engine reads when `bound` (from `output_bound`) is None or above it;
    changes `document` in place and says whether it did."""
    if not SHAPES[api].generates or (bound is not None and bound <= cap):
        return False
    if api in _SINGLE_FIELD:
        document[_SINGLE_FIELD[api]] = cap
        return True
    for name in _CHAT_FIELDS:
        value = document.get(name)
        if isinstance(value, int) and value > cap:
            document[name] = cap
    if document.get("max_tokens") is None and not document.get("max_completion_tokens"):
        document["max_tokens"] = cap  # read by both releases when max_completion_tokens is null or 0
    return True
