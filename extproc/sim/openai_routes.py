"""The vLLM OpenAI-server endpoints of one replica: generation, embeddings, tokenizer and render."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from extproc.sim.driver import EngineLoop, generate
from extproc.sim.engine import Engine, GenRequest
from extproc.sim.faults import Faults
from extproc.sim.protocol import (
    DONE,
    ApiError,
    Limits,
    embedding_vector,
    output_plan,
    parse_chat_prompt,
    parse_completion_prompt,
    parse_embedding_inputs,
    parse_limits,
    usage,
)
from extproc.sim.responses import StreamFormatter, chat_response, completion_response, models_response
from extproc.sim.spec import ReplicaSpec
from extproc.sim.timings import HEADER, Stamp, Timings
from extproc.sim.tokens import Tokenizer

__all__ = ["CrashedError", "OpenAIRoutes", "Planned", "RenderMemo", "abort_connection", "compact_json", "read_json"]


@dataclass(frozen=True, slots=True)
class Planned:
    """A generation request as the engine will run it."""

    model: str  # the name to echo
    gen: GenRequest
    pieces: list[str]  # the output's text, token by token
    limits: Limits


class CrashedError(Exception):
    """The crash_mid_stream fault cut this response's connection."""


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


async def read_json(request: web.Request) -> dict[str, Any]:
    return parse_json(await request.read())


class RenderMemo:
    """The last `size` render answers by request body, shared by the replicas of one simulator process.

    A router that renders every request on every worker before choosing one (vllm-router's cache_aware) makes
    this one process render and tokenize each prompt once per replica: work that a real fleet spreads over as
    many API servers, and that here would slow the engines' step loop for every strategy. The answer of a
    replica is the same as its siblings' for the same body (same template, same tokenizer), so it is kept;
    each replica still checks the model it serves and gets its own request id.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._answers: OrderedDict[tuple[bool, bytes], tuple[dict[str, Any], str]] = OrderedDict()
        self.hits = 0

    def get(self, chat: bool, raw: bytes) -> tuple[dict[str, Any], str] | None:
        """(the parsed body, the answer's JSON after its request id) or None."""
        found = self._answers.get((chat, raw))
        if found is not None:
            self.hits += 1
            self._answers.move_to_end((chat, raw))
        return found

    def put(self, chat: bool, raw: bytes, body: dict[str, Any], rest: str) -> None:
        self._answers[(chat, raw)] = (body, rest)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)


def abort_connection(request: web.Request) -> CrashedError:
    """Cut the client's connection without a response; returns the error that unwinds the handler."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return CrashedError()


class OpenAIRoutes:
    def __init__(self, spec: ReplicaSpec, engine: Engine, loop: EngineLoop, tokenizer: Tokenizer,
                 faults: Faults, adapters: Mapping[str, None] | None = None,
                 check_awake: Callable[[], None] | None = None, renders: RenderMemo | None = None) -> None:
        """`adapters`: the LoRA adapters loaded now (runtime loading changes it); `check_awake` raises the 503 of
        a sleeping engine (extproc/sim/lifecycle.py); `renders`: the process's shared render answers."""
        self.renders = renders or RenderMemo()
        self.spec = spec
        self.adapters: Mapping[str, None] = adapters if adapters is not None else dict.fromkeys(spec.lora_adapters)
        self._check_awake = check_awake or (lambda: None)
        self.engine = engine
        self.loop = loop
        self.tokenizer = tokenizer
        self.faults = faults
        self.created = int(time.time())
        self.timings = Timings()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions/render", self.chat_render),
            web.post("/v1/completions/render", self.completions_render),
            web.post("/v1/embeddings", self.embeddings),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/v1/models", self.models),
        ]

    # -- helpers -------------------------------------------------------------------------------------

    def resolve_model(self, body: Mapping[str, Any]) -> tuple[str, str | None]:
        """(name to echo, LoRA adapter or None); a missing model means the base model, as in vLLM."""
        model = body.get("model")
        if model is None or model == self.spec.model:
            return self.spec.model, None
        if isinstance(model, str) and model in self.adapters:
            return model, model
        raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _check_fault(self) -> None:
        status = self.faults.inference_error()
        if status is not None:
            raise ApiError(status, f"simulated failure ({status})")

    @staticmethod
    def _request_id(request: web.Request, prefix: str) -> str:
        return prefix + (request.headers.get("x-request-id") or uuid.uuid4().hex)

    def _prompt(self, body: Mapping[str, Any], chat: bool) -> tuple[str, list[int]]:
        if chat:
            return parse_chat_prompt(body, self.tokenizer)
        return parse_completion_prompt(body, self.tokenizer)

    # -- generation ------------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def plan(self, body: Mapping[str, Any], request_id: str, *, chat: bool) -> Planned:
        """What the engine will do for a generation request: checked, tokenized, its output decided."""
        self._check_awake()
        model, lora = self.resolve_model(body)
        self._check_fault()
        _, prompt_ids = self._prompt(body, chat)
        profile = self.spec.profile
        limits = parse_limits(body, len(prompt_ids), profile, chat=chat)
        length, finish_reason, text_seed = output_plan(prompt_ids, limits, profile, self.spec.seed)
        pieces, output_ids = self.tokenizer.generate(length, text_seed)
        return Planned(model, GenRequest(request_id, prompt_ids, output_ids, lora, finish_reason=finish_reason),
                       pieces, limits)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        arrive = time.monotonic()
        body = await read_json(request)
        planned = self.plan(body, self._request_id(request, "chatcmpl-" if chat else "cmpl-"), chat=chat)
        model, gen, pieces, limits = planned.model, planned.gen, planned.pieces, planned.limits
        request_id, prompt_ids, length, finish_reason = gen.request_id, gen.prompt_ids, len(pieces), gen.finish_reason
        created = int(time.time())
        if limits.stream:
            sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
            stamp = self.timings.start(arrive, sockname[1] if sockname else self.spec.port)
            return await self._stream(request, gen, pieces, limits, model, created, stamp, chat=chat)
        crash_after = self.faults.settings.crash_mid_stream
        await generate(self.engine, self.loop, gen, self.spec.stream_chunk_tokens, None)
        if crash_after is not None:
            raise abort_connection(request)
        counts = usage(len(prompt_ids), length, gen.cached_tokens)
        build = chat_response if chat else completion_response
        payload = build(request_id, created, model, "".join(pieces), finish_reason, counts)
        return web.json_response(payload, dumps=compact_json)

    async def _stream(self, request: web.Request, gen: GenRequest, pieces: list[str], limits: Limits,
                      model: str, created: int, stamp: Stamp, *, chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache", HEADER: stamp.id})
        await response.prepare(request)
        formatter = StreamFormatter(gen.request_id, created, model, chat=chat)
        crash_after = self.faults.settings.crash_mid_stream
        total = len(pieces)
        sent = 0

        async def emit(start: int, count: int) -> None:
            nonlocal sent
            if crash_after is not None and sent >= crash_after:
                raise abort_connection(request)
            end = start + count
            data = formatter.text("".join(pieces[start:end]), gen.finish_reason if end >= total else None)
            if start == 0 and chat:
                data = formatter.role() + data
            await response.write(data)
            if sent == 0:
                stamp.submit, stamp.token, stamp.written = gen.arrival, gen.first_token_at, time.monotonic()
            sent += 1

        await generate(self.engine, self.loop, gen, self.spec.stream_chunk_tokens, emit)
        tail = DONE
        if limits.include_usage:
            tail = formatter.usage(usage(len(gen.prompt_ids), total, gen.cached_tokens)) + DONE
        await response.write(tail)
        await response.write_eof()
        return response

    async def _render(self, request: web.Request, *, chat: bool) -> web.Response:
        raw = await request.read()
        known = self.renders.get(chat, raw)
        body = known[0] if known is not None else parse_json(raw)
        model, _ = self.resolve_model(body)
        if known is not None:
            rest = known[1]
        else:
            text, prompt_ids = self._prompt(body, chat)
            limits = parse_limits(body, len(prompt_ids), self.spec.profile, chat=chat)
            sampling = {"max_tokens": limits.max_tokens, "min_tokens": limits.min_tokens,
                        "ignore_eos": limits.ignore_eos, "seed": limits.seed}
            rest = compact_json({"model": model, "prompt": text, "token_ids": prompt_ids,
                                 "num_tokens": len(prompt_ids), "sampling_params": sampling, "stream": limits.stream})
            self.renders.put(chat, raw, body, rest)
        request_id = compact_json(self._request_id(request, "chatcmpl-" if chat else "cmpl-"))
        return web.Response(text=f'{{"request_id":{request_id},{rest[1:]}', content_type="application/json")

    async def chat_render(self, request: web.Request) -> web.Response:
        return await self._render(request, chat=True)

    async def completions_render(self, request: web.Request) -> web.Response:
        return await self._render(request, chat=False)

    # -- embeddings ------------------------------------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self._check_awake()
        model, lora = self.resolve_model(body)
        self._check_fault()
        inputs = parse_embedding_inputs(body, self.tokenizer)
        profile = self.spec.profile
        if any(len(ids) > profile.max_model_len for ids in inputs):
            raise ApiError(400, f"This model's maximum context length is {profile.max_model_len} tokens.",
                           "input")
        dims = body.get("dimensions", profile.embedding_dim)
        if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= profile.embedding_dim:
            raise ApiError(400, f"dimensions must be an integer in [1, {profile.embedding_dim}]",
                           "dimensions")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise ApiError(400, "encoding_format must be 'float' or 'base64'", "encoding_format")
        request_id = self._request_id(request, "embd-")
        gens = [GenRequest(f"{request_id}-{i}", ids, [], lora) for i, ids in enumerate(inputs)]
        await asyncio.gather(*(generate(self.engine, self.loop, g, 1, None) for g in gens))
        data = [{"object": "embedding", "index": i, "embedding": embedding_vector(ids, dims, encoding)}
                for i, ids in enumerate(inputs)]
        prompt_tokens = sum(len(ids) for ids in inputs)
        return web.json_response({
            "id": request_id, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None},
        }, dumps=compact_json)

    # -- tokenizer and models --------------------------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.resolve_model(body)
        if "messages" in body:
            _, ids = parse_chat_prompt(body, self.tokenizer)
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode(body["prompt"])
        else:
            raise ApiError(400, "tokenize needs a string prompt or messages", "prompt")
        strs = [self.tokenizer.decode([t]) for t in ids] if body.get("return_token_strs") is True else None
        return web.json_response({"count": len(ids), "max_model_len": self.spec.profile.max_model_len,
                                  "tokens": ids, "token_strs": strs}, dumps=compact_json)

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.resolve_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in tokens):
            raise ApiError(400, "tokens must be a list of integers", "tokens")
        return web.json_response({"prompt": self.tokenizer.decode(tokens)}, dumps=compact_json)

    async def models(self, request: web.Request) -> web.Response:
        payload = models_response(self.spec.model, tuple(self.adapters), self.created,
                                  self.spec.profile.max_model_len)
        return web.json_response(payload, dumps=compact_json)
