"""The simulator's Anthropic Messages and Responses endpoints: vLLM's body and event shapes, usage equal to the
chat request they become, Anthropic-shaped errors, the in-process response store."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from extproc.sim import Fleet

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"
SYSTEM = "You are a careful assistant. " * 20


async def events(response: aiohttp.ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs; every data line must follow its event line."""
    out: list[tuple[str, dict[str, Any]]] = []
    name = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name
            out.append((name, data))
    return out


async def chat_prompt_tokens(http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> int:
    async with http.post(url + "/tokenize", json={"model": MODEL, "messages": messages}) as resp:
        return int((await resp.json())["count"])


async def test_messages_json_and_stream(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[1].url  # 4 tokens per chunk
    body = {"model": MODEL, "max_tokens": 10, "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc123"},
        {"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Explain prefix caching."}]}]}
    # The billing block is dropped, as vLLM does: the prompt is the chat of system + user.
    expected = await chat_prompt_tokens(http, url, [{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": "Explain prefix caching."}])
    async with http.post(url + "/v1/messages", json=body) as resp:
        assert resp.status == 200
        message = await resp.json()
    assert message["type"] == "message" and message["role"] == "assistant" and message["model"] == MODEL
    assert message["content"][0]["type"] == "text" and message["content"][0]["text"]
    assert message["usage"]["input_tokens"] == expected
    assert 1 <= message["usage"]["output_tokens"] <= 10
    assert message["stop_reason"] in ("end_turn", "max_tokens")
    async with http.post(url + "/v1/messages", json={**body, "stream": True}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        streamed = await events(resp)
    names = [name for name, _ in streamed]
    assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start, delta = streamed[0][1], streamed[-2][1]
    assert start["message"]["usage"] == {"input_tokens": expected, "output_tokens": 0}
    text = "".join(d["delta"]["text"] for n, d in streamed if n == "content_block_delta")
    assert text == message["content"][0]["text"]  # same prompt, same seed: the same answer
    assert delta["usage"] == {"input_tokens": expected, "output_tokens": message["usage"]["output_tokens"],
                              "cache_read_input_tokens": delta["usage"]["cache_read_input_tokens"]}
    assert delta["usage"]["cache_read_input_tokens"] > 0  # the same prompt again: a prefix-cache hit


async def test_messages_errors_are_anthropic_shaped(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    for body in ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},  # no max_tokens
                 {"model": MODEL, "max_tokens": 4, "messages": []},
                 {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}):
        async with http.post(url + "/v1/messages", json=body) as resp:
            assert resp.status in (400, 404)
            error = await resp.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}


async def test_responses_json_stream_and_store(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[1].url
    body = {"model": MODEL, "instructions": SYSTEM, "input": "Explain prefix caching.", "max_output_tokens": 9,
            "request_id": "resp_fixed1"}
    expected = await chat_prompt_tokens(http, url, [{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": "Explain prefix caching."}])
    async with http.post(url + "/v1/responses", json=body) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert answer["id"] == "resp_fixed1" and answer["object"] == "response"
    assert answer["usage"]["input_tokens"] == expected
    assert answer["usage"]["total_tokens"] == expected + answer["usage"]["output_tokens"]
    assert answer["output"][0]["content"][0]["type"] == "output_text"
    async with http.post(url + "/v1/responses", json={**body, "stream": True, "request_id": "resp_s"}) as resp:
        streamed = await events(resp)
    names = [name for name, _ in streamed]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in streamed] == list(range(len(streamed)))
    assert streamed[0][1]["response"]["usage"] is None
    final = streamed[-1][1]["response"]["usage"]
    assert (final["input_tokens"], final["output_tokens"]) == (expected, answer["usage"]["output_tokens"])
    assert final["input_tokens_details"]["cached_tokens"] > 0  # the same prompt again: a prefix-cache hit
    # The store holds the conversation on this replica only.
    follow = {"model": MODEL, "input": "And then?", "previous_response_id": "resp_fixed1", "max_output_tokens": 4}
    async with http.post(url + "/v1/responses", json=follow) as resp:
        assert resp.status == 200
        assert (await resp.json())["usage"]["input_tokens"] > 4
    async with http.post(fleet.replicas[0].url + "/v1/responses", json=follow) as resp:
        assert resp.status == 404
        assert "resp_fixed1" in (await resp.json())["error"]["message"]
