"""Decisions for the Messages, Responses and scoring APIs: media and tools in the estimate, errors in the path's
shape, Responses ids written by the gateway and continuations pinned (extproc/gateway/)."""

from __future__ import annotations

import json
from typing import Any

from extproc.gateway import RequestHead, Respond, Route
from tests.unit.gateway.harness import Harness

POLICY = """\
limits: {calibrate_prompt_tokens: false}
pools:
  - name: chat
    model: org/chat-8b
    aliases: [chat]
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    image_tokens: 1000
    audio_tokens: 300
    video_tokens: 5000
"""


def decide(harness: Harness, path: str, document: dict[str, Any], keep: bool = False) -> Route | Respond:
    exchange, early = harness.headers(RequestHead("POST", path, {}))
    assert early is None
    decision = harness.body(exchange, json.dumps(document).encode())
    assert isinstance(decision, Route | Respond)
    if isinstance(decision, Route) and not keep:
        harness.finish(exchange)
    return decision


def estimate(harness: Harness, document: dict[str, Any]) -> int:
    route = decide(harness, "/v1/messages", document)
    assert isinstance(route, Route) and route.metadata is not None
    return int(route.metadata["prompt_estimate"])


def test_images_audio_and_tools_count_in_the_estimate() -> None:
    harness = Harness(POLICY)
    text = {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"}]}]}
    base = estimate(harness, text)
    with_image = json.loads(json.dumps(text))
    with_image["messages"][0]["content"].append({"type": "image", "source": {"type": "base64", "data": "A" * 4000}})
    assert estimate(harness, with_image) == base + 1000  # the pool's figure, not the base64's length
    with_video = json.loads(json.dumps(with_image))
    with_video["messages"][0]["content"].append({"type": "video", "source": {"type": "url", "url": "http://x/v"}})
    assert estimate(harness, with_video) == base + 1000 + 5000
    with_tools = {**text, "tools": [{"name": "Bash", "description": "Run a command. " * 40,
                                     "input_schema": {"type": "object"}}]}
    assert estimate(harness, with_tools) >= base + 150
    responses = {"model": "chat", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "listen"}, {"type": "input_audio", "input_audio": {"data": "B" * 900}}]}]}
    route = decide(harness, "/v1/responses", responses)
    assert isinstance(route, Route) and route.metadata is not None
    assert int(route.metadata["prompt_estimate"]) >= 300


def test_errors_take_the_shape_of_the_path() -> None:
    harness = Harness(POLICY)
    refused = decide(harness, "/v1/messages", {"model": "chat", "messages": [{"role": "user", "content": "x"}]})
    assert isinstance(refused, Respond) and refused.status == 400
    assert json.loads(refused.body)["type"] == "error"
    missing = decide(harness, "/v1/messages", {"model": "nope", "max_tokens": 3, "messages": []})
    assert isinstance(missing, Respond) and json.loads(missing.body)["error"]["type"] == "not_found_error"
    _, early = harness.headers(RequestHead("GET", "/v1/messages", {}))
    assert early is not None and json.loads(early.body)["error"]["type"] == "invalid_request_error"
    openai = decide(harness, "/v1/responses", {"model": "nope", "input": "x"})
    assert isinstance(openai, Respond) and json.loads(openai.body)["error"]["code"] == "model_not_found"


def test_responses_ids_are_the_gateways_and_continuations_stay_home() -> None:
    harness = Harness(POLICY)
    first = decide(harness, "/v1/responses", {"model": "chat", "input": "hi", "request_id": "resp_mine"})
    assert isinstance(first, Route) and first.body is not None
    response_id = json.loads(first.body)["request_id"]
    assert response_id != "resp_mine" and response_id.startswith("resp_")
    home = first.endpoints[0]
    for turn in range(6):  # each stays in flight: load alone would move the next one elsewhere
        follow = decide(harness, "/v1/responses", {"model": "chat", "input": f"turn {turn}",
                                                   "previous_response_id": response_id}, keep=True)
        assert isinstance(follow, Route) and follow.endpoints[0] == home
        assert len(set(follow.endpoints)) == len(follow.endpoints)  # fallbacks are other endpoints
        response_id = json.loads(follow.body or b"{}")["request_id"]
    fresh = decide(harness, "/v1/responses", {"model": "chat", "input": "a new conversation"})
    assert isinstance(fresh, Route) and fresh.endpoints[0] != home  # the loaded endpoint is avoided otherwise
    other = decide(harness, "/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "x"}],
                                                      "request_id": "kept"})
    assert isinstance(other, Route) and json.loads(other.body or b"{}")["request_id"] == "kept"  # Responses only


def test_continuations_find_home_in_a_pool_larger_than_the_candidate_sample() -> None:
    endpoints = ", ".join(f'"10.0.{i // 200}.{i % 200 + 1}:8000"' for i in range(64))
    harness = Harness(f"pools:\n  - name: chat\n    model: org/chat-8b\n    endpoints: [{endpoints}]\n")
    first = decide(harness, "/v1/responses", {"model": "org/chat-8b", "input": "hi"})
    assert isinstance(first, Route) and first.body is not None
    response_id, home = json.loads(first.body)["request_id"], first.endpoints[0]
    for turn in range(10):
        follow = decide(harness, "/v1/responses", {"model": "org/chat-8b", "input": f"unrelated text {turn}",
                                                   "previous_response_id": response_id})
        assert isinstance(follow, Route) and follow.endpoints[0] == home
        response_id = json.loads(follow.body or b"{}")["request_id"]


def test_a_tokenizer_request_without_model_goes_to_the_only_pool() -> None:
    harness = Harness(POLICY)
    for path, document in (("/tokenize", {"prompt": "count me"}), ("/detokenize", {"tokens": [1, 2, 3]})):
        route = decide(harness, path, document)
        assert isinstance(route, Route) and route.pool == "chat"
        assert route.body is None  # sent as the client wrote it: vLLM's tokenizer needs no model
    refused = decide(harness, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x"}]})
    assert isinstance(refused, Respond) and refused.status == 400  # Anthropic's API requires it
    two = Harness(POLICY + """\
  - name: code
    model: org/code
    endpoints: ["10.0.0.9:8000"]
""")
    refused = decide(two, "/tokenize", {"prompt": "count me"})
    assert isinstance(refused, Respond) and refused.status == 400 and b"missing_model" in refused.body
