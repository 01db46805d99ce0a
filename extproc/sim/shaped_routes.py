"""/v1/messages (Anthropic) and /v1/responses (OpenAI Responses) of one replica: converted into a chat request,
run by the same engine, answered in the API's own shapes (extproc/sim/api_streams.py).

Errors on /v1/messages are Anthropic-shaped, as vLLM's Anthropic router translates them. `GET
/sim/last-request` shows the headers of the latest request on each of these paths (tests check what the
gateway passed through, such as `anthropic-version`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from extproc.sim.api_shapes import ResponseStore, messages_to_chat, responses_to_chat
from extproc.sim.api_streams import (
    MessagesStream,
    ResponsesStream,
    anthropic_message,
    responses_body,
    responses_usage,
)
from extproc.sim.driver import generate
from extproc.sim.openai_routes import OpenAIRoutes, Planned, abort_connection, compact_json, read_json
from extproc.sim.protocol import ApiError

__all__ = ["ShapedRoutes"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def anthropic_error(error: ApiError) -> web.Response:
    kind = error.body()["error"]["type"]  # vLLM copies its own error type into Anthropic's shape
    return web.json_response({"type": "error", "error": {"type": kind, "message": error.message}},
                             status=error.status, dumps=compact_json)


class ShapedRoutes:
    def __init__(self, base: OpenAIRoutes) -> None:
        self.base = base
        self.store = ResponseStore()
        self.last_headers: dict[str, dict[str, str]] = {}

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/messages", self.messages), web.post("/v1/responses", self.responses),
                web.get("/sim/last-request", self.last_request)]

    async def last_request(self, request: web.Request) -> web.Response:
        return web.json_response(self.last_headers.get(request.query.get("path", ""), {}), dumps=compact_json)

    async def _run(self, request: web.Request, planned: Planned, start: bytes,
                   text: Callable[[str, bool], bytes], end: Callable[[], bytes]) -> web.StreamResponse:
        """Generate; stream events when the request asked for a stream (else the caller answers)."""
        base = self.base
        gen, pieces = planned.gen, planned.pieces
        crash_after = base.faults.settings.crash_mid_stream
        if not planned.limits.stream:
            await generate(base.engine, base.loop, gen, base.spec.stream_chunk_tokens, None)
            if crash_after is not None:
                raise abort_connection(request)
            return web.StreamResponse()
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        if start:
            await response.write(start)
        sent = 0

        async def emit(first: int, count: int) -> None:
            nonlocal sent
            if crash_after is not None and sent >= crash_after:
                raise abort_connection(request)
            await response.write(text("".join(pieces[first:first + count]), first == 0))
            sent += 1

        await generate(base.engine, base.loop, gen, base.spec.stream_chunk_tokens, emit)
        await response.write(end())
        await response.write_eof()
        return response

    async def messages(self, request: web.Request) -> web.StreamResponse:
        self.last_headers["/v1/messages"] = dict(request.headers)
        try:
            chat = messages_to_chat(await read_json(request))
            planned = self.base.plan(chat, self.base._request_id(request, "chatcmpl-"), chat=True)
        except ApiError as error:
            return anthropic_error(error)
        gen = planned.gen
        prompt_tokens = len(gen.prompt_ids)
        stream = MessagesStream(gen.request_id, planned.model, prompt_tokens)
        done = await self._run(request, planned, b"", stream.text,
                               lambda: stream.end(gen.finish_reason, len(planned.pieces), gen.cached_tokens))
        if planned.limits.stream:
            return done
        return web.json_response(anthropic_message(gen.request_id, planned.model, "".join(planned.pieces),
                                                   gen.finish_reason, prompt_tokens, len(planned.pieces),
                                                   gen.cached_tokens),
                                 dumps=compact_json)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        self.last_headers["/v1/responses"] = dict(request.headers)
        body = await read_json(request)
        chat = responses_to_chat(body, self.store.history(body))
        asked = body.get("request_id")
        response_id = asked if isinstance(asked, str) and asked else "resp_" + uuid.uuid4().hex
        planned = self.base.plan(chat, response_id, chat=True)
        gen = planned.gen
        answer = "".join(planned.pieces)
        if body.get("store", True) is not False:
            self.store.keep(response_id, chat["messages"], answer)

        def usage() -> dict[str, Any]:
            return responses_usage(len(gen.prompt_ids), len(planned.pieces), gen.cached_tokens)

        stream = ResponsesStream(response_id, body, planned.model)
        done = await self._run(request, planned, stream.start() if planned.limits.stream else b"", stream.text,
                               lambda: stream.end(gen.finish_reason, usage()))
        if planned.limits.stream:
            return done
        return web.json_response(responses_body(response_id, body, planned.model, answer, gen.finish_reason,
                                                usage(), int(time.time())), dumps=compact_json)
