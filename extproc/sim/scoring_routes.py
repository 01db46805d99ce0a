"""vLLM's scoring endpoints of one replica (/v1/rerank, /rerank, /v2/rerank, /v1/score, /score) and Anthropic's
/v1/messages/count_tokens.

A cross-encoder scores each (query, document) pair in one forward pass: the engine runs every pair as a prompt
with no output; usage counts the pairs' prompt tokens (rerank: `prompt_tokens` and `total_tokens` only, as
vLLM's RerankUsage; score: the usual usage with `completion_tokens` 0). Scores are deterministic in the texts.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

from aiohttp import web

from extproc.sim.api_shapes import messages_to_chat
from extproc.sim.driver import generate
from extproc.sim.engine import GenRequest
from extproc.sim.openai_routes import OpenAIRoutes, compact_json, read_json
from extproc.sim.protocol import ApiError, parse_chat_prompt
from extproc.sim.shaped_routes import anthropic_error

__all__ = ["ScoringRoutes"]


def _texts(value: Any, field: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ApiError(400, f"{field} must be a string or a non-empty list of strings", field)


def _score(first: str, second: str) -> float:
    digest = hashlib.blake2b(f"{first}\x00{second}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class ScoringRoutes:
    def __init__(self, base: OpenAIRoutes) -> None:
        self.base = base

    def routes(self) -> list[web.RouteDef]:
        return [*(web.post(path, self.rerank) for path in ("/v1/rerank", "/rerank", "/v2/rerank")),
                *(web.post(path, self.score) for path in ("/v1/score", "/score")),
                web.post("/v1/messages/count_tokens", self.count_tokens)]

    async def _run_pairs(self, pairs: list[tuple[str, str]], lora: str | None) -> int:
        """Run every pair through the engine; returns their prompt tokens."""
        base = self.base
        base._check_awake()
        base._check_fault()
        prompts = [base.tokenizer.encode(first) + base.tokenizer.encode(second) for first, second in pairs]
        if any(len(ids) > base.spec.profile.max_model_len for ids in prompts):
            raise ApiError(400, f"This model's maximum context length is {base.spec.profile.max_model_len} tokens.")
        request_id = uuid.uuid4().hex
        gens = [GenRequest(f"score-{request_id}-{i}", ids, [], lora) for i, ids in enumerate(prompts)]
        await asyncio.gather(*(generate(base.engine, base.loop, g, 1, None) for g in gens))
        return sum(len(ids) for ids in prompts)

    async def rerank(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        model, lora = self.base.resolve_model(body)
        query = body.get("query")
        if not isinstance(query, str):
            raise ApiError(400, "query must be a string", "query")
        documents = _texts(body.get("documents"), "documents")
        tokens = await self._run_pairs([(query, d) for d in documents], lora)
        ranked = sorted(range(len(documents)), key=lambda i: -_score(query, documents[i]))
        results = [{"index": i, "document": {"text": documents[i], "multi_modal": None},
                    "relevance_score": _score(query, documents[i])} for i in ranked]
        top_n = body.get("top_n") or 0
        if isinstance(top_n, int) and top_n > 0:
            results = results[:top_n]
        return web.json_response({"id": "rerank-" + uuid.uuid4().hex, "model": model,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results},
                                 dumps=compact_json)

    async def score(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        model, lora = self.base.resolve_model(body)
        first = _texts(body.get("text_1", body.get("queries")), "text_1")
        second = _texts(body.get("text_2", body.get("documents")), "text_2")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise ApiError(400, "text_1 and text_2 must have the same length (or text_1 one item)", "text_1")
        pairs = list(zip(first, second, strict=True))
        tokens = await self._run_pairs(pairs, lora)
        data = [{"index": i, "object": "score", "score": _score(a, b)} for i, (a, b) in enumerate(pairs)]
        return web.json_response({"id": "score-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
                                  "model": model, "data": data,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                            "prompt_tokens_details": None}}, dumps=compact_json)

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            self.base.resolve_model(body)
            chat = messages_to_chat({**body, "max_tokens": 1})  # count_tokens has no max_tokens
            _, ids = parse_chat_prompt(chat, self.base.tokenizer)
        except ApiError as error:
            return anthropic_error(error)
        return web.json_response({"input_tokens": len(ids), "context_management": {"original_input_tokens": len(ids)}},
                                 dumps=compact_json)
