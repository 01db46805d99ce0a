from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extproc.sim import Fleet

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"
MESSAGES = [{"role": "system", "content": "You are a careful assistant. " * 20},
            {"role": "user", "content": "Explain prefix caching in one paragraph."}]


async def read_sse(response: aiohttp.ClientResponse) -> list[Any]:
    events: list[Any] = []
    async for line in response.content:
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


async def test_chat_stream_with_include_usage(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    replica = fleet.replicas[1]  # 4 tokens per chunk
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    async with http.post(replica.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-sim-replica"] == replica.address
        events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    # role chunk, first token alone, then 4 + 4 + 1 tokens
    assert len(chunks) == 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + 10
    async with http.post(replica.url + "/tokenize", json={"model": MODEL, "prompt": "".join(deltas)}) as resp:
        assert (await resp.json())["count"] == 10


async def test_non_stream_usage_matches_tokenize_and_cached_tokens(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.replicas[0].url
    async with http.post(url + "/tokenize", json={"model": MODEL, "messages": MESSAGES}) as resp:
        prompt_tokens = (await resp.json())["count"]
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12}
    results = []
    for _ in range(2):
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            results.append(await resp.json())
    first, second = results
    assert first["object"] == "chat.completion" and first["model"] == MODEL
    assert first["usage"]["prompt_tokens"] == prompt_tokens
    assert 6 <= first["usage"]["completion_tokens"] <= 12
    assert first["usage"]["total_tokens"] == prompt_tokens + first["usage"]["completion_tokens"]
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt_tokens - 1) // 16 * 16


async def test_unknown_model_and_bad_json(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    async with http.post(url + "/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["code"] == 404 and error["type"] == "NotFoundError" and "other" in error["message"]
    async with http.post(url + "/v1/chat/completions", data=b"{nope") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == 400
    assert fleet.replicas[0].stats()["requests"] == 0


async def test_lora_adapter_is_listed_served_and_reported(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    async with http.get(url + "/v1/models") as resp:
        ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == [MODEL, "sql"]
    async with http.post(url + "/v1/completions", json={"model": "sql", "prompt": "select", "max_tokens": 3,
                                                         "ignore_eos": True}) as resp:
        body = await resp.json()
    assert body["model"] == "sql" and body["usage"]["completion_tokens"] == 3
    async with http.post(url + "/v1/embeddings", json={"model": MODEL, "input": ["a", "b c"]}) as resp:
        emb = await resp.json()
    assert [len(d["embedding"]) for d in emb["data"]] == [64, 64] and emb["usage"]["prompt_tokens"] == 3


async def test_metrics_after_traffic_show_prefix_hits(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
    for _ in range(3):
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    values = {(s.name, s.labels.get("finished_reason")): s.value
              for f in text_string_to_metric_families(text) for s in f.samples
              if s.labels.get("model_name") == MODEL}
    queries = values[("vllm:prefix_cache_queries_total", None)]
    hits = values[("vllm:prefix_cache_hits_total", None)]
    assert queries > 0 and 0.5 * queries < hits < queries  # two of three prompts hit nearly fully
    assert values[("vllm:num_requests_running", None)] == 0
    assert values[("vllm:time_to_first_token_seconds_count", None)] == 3
    assert sum(v for (name, _), v in values.items() if name == "vllm:request_success_total") == 3
    async with http.get(fleet.replicas[1].url + "/metrics") as resp:
        other = await resp.text()
    assert 'vllm:prefix_cache_hits_total{model_name="org/model:8b"} 0.0' in other  # replicas share nothing


async def test_render_returns_prompt_and_ids_without_generating(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.replicas[0].url
    body = {"model": MODEL, "messages": MESSAGES}
    async with http.post(url + "/v1/chat/completions/render", json=body) as resp:
        rendered = await resp.json()
    async with http.post(url + "/tokenize", json={"model": MODEL, "messages": MESSAGES}) as resp:
        tokens = (await resp.json())["tokens"]
    assert rendered["token_ids"] == tokens and rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert fleet.replicas[0].stats()["requests"] == 0
    async with http.post(url + "/detokenize", json={"tokens": tokens}) as resp:
        assert (await resp.json())["prompt"] == rendered["prompt"]


async def test_replicas_share_render_answers_but_check_their_own_model(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 7}
    answers = []
    for replica, request_id in ((fleet.replicas[0], "a"), (fleet.replicas[1], "b")):
        async with http.post(replica.url + "/v1/chat/completions/render", json=body,
                             headers={"x-request-id": request_id}) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            answers.append(await resp.json())
    assert answers[0]["request_id"] == "chatcmpl-a" and answers[1]["request_id"] == "chatcmpl-b"
    assert {k: v for k, v in answers[0].items() if k != "request_id"} == {
        k: v for k, v in answers[1].items() if k != "request_id"}
    assert answers[0]["model"] == MODEL and answers[0]["sampling_params"]["max_tokens"] == 7
    assert fleet.renders.hits == 1  # rendered and tokenized once
    adapter = {**body, "model": "sql"}  # only replica 0 serves it
    async with http.post(fleet.replicas[0].url + "/v1/chat/completions/render", json=adapter) as resp:
        assert resp.status == 200
    async with http.post(fleet.replicas[1].url + "/v1/chat/completions/render", json=adapter) as resp:
        assert resp.status == 404  # the memo never answers for a model the replica does not serve
    async with http.post(fleet.replicas[1].url + "/v1/chat/completions/render", data=b"{not json") as resp:
        assert resp.status == 400
