"""The APIs the gateway routes, which path serves each, and what tells them apart (one table, no code per API).

Every API is one shape of the same thing, a request for a model: a conversation (or a prompt), an output bound,
a stream flag. `ApiShape` says where each of these lives in the body and how the API answers errors; the
parser (`spec.py`), the prompt readers (`prompt.py`, `conversation.py`) and the output bound (`output.py`) read
it instead of branching per endpoint.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PATHS", "RATELIMIT_HEADERS", "SHAPES", "Api", "ApiShape", "api_for_path"]


class Api(enum.Enum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    MESSAGES = "messages"  # Anthropic Messages (vLLM's /v1/messages)
    COUNT_TOKENS = "count_tokens"  # Anthropic's /v1/messages/count_tokens
    RESPONSES = "responses"  # OpenAI Responses (vLLM's /v1/responses)
    RERANK = "rerank"  # vLLM's /v1/rerank (Jina / Cohere style)
    SCORE = "score"  # vLLM's /v1/score (cross-encoder pairs)
    TOKENIZE = "tokenize"  # vLLM's /tokenize
    DETOKENIZE = "detokenize"  # vLLM's /detokenize


@dataclass(frozen=True, slots=True)
class ApiShape:
    """Where an API keeps what routing reads."""

    conversation: str | None  # the array of messages / items the engine renders with its chat template
    dialect: str = "openai"  # how that conversation reads: "openai", "anthropic" or "responses"
    generates: bool = True  # False: nothing is generated (embeddings, scoring, the tokenizer)
    streams: bool = True
    usage_in_stream: bool = False  # a streamed response always reports usage (no stream_options needed)
    anthropic_errors: bool = False  # errors as {"type": "error", "error": {"type", "message"}}
    engine_work: bool = True  # False: only the tokenizer runs (no model pass): no token budget is spent


_POOLING = ApiShape(None, generates=False, streams=False)
_TOKENIZER = ApiShape(None, generates=False, streams=False, engine_work=False)

SHAPES: dict[Api, ApiShape] = {
    Api.CHAT: ApiShape("messages"),
    Api.COMPLETIONS: ApiShape(None),
    Api.EMBEDDINGS: ApiShape("messages", generates=False, streams=False),
    Api.MESSAGES: ApiShape("messages", "anthropic", usage_in_stream=True, anthropic_errors=True),
    Api.COUNT_TOKENS: ApiShape("messages", "anthropic", generates=False, streams=False, anthropic_errors=True,
                               engine_work=False),
    Api.RESPONSES: ApiShape("input", "responses", usage_in_stream=True),
    Api.RERANK: _POOLING,
    Api.SCORE: _POOLING,
    Api.TOKENIZE: _TOKENIZER,
    Api.DETOKENIZE: _TOKENIZER,
}

PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
    "/v1/messages": Api.MESSAGES,
    "/v1/messages/count_tokens": Api.COUNT_TOKENS,
    "/v1/responses": Api.RESPONSES,
    "/v1/rerank": Api.RERANK,
    "/rerank": Api.RERANK,
    "/v2/rerank": Api.RERANK,
    "/v1/score": Api.SCORE,
    "/score": Api.SCORE,
    "/tokenize": Api.TOKENIZE,
    "/detokenize": Api.DETOKENIZE,
}


def api_for_path(path: str) -> Api | None:
    return PATHS.get(path.partition("?")[0].rstrip("/") or "/")


# The rate-limit response headers the gateway may send, OpenAI's then Anthropic's (Messages API only): the
# service computes their values, Envoy adds them to the response (extproc/xds/render.py).
RATELIMIT_HEADERS: tuple[str, ...] = (
    *(f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens") for what in ("limit", "remaining", "reset")),
    *(f"anthropic-ratelimit-{kind}-{what}" for kind in ("requests", "tokens") for what in ("limit", "remaining",
                                                                                         "reset")),
)
