"""The simulator's scoring endpoints and Anthropic count_tokens: vLLM's shapes, usage = the pairs' prompt tokens."""

from __future__ import annotations

import aiohttp
import pytest

from extproc.sim import Fleet

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"


async def count(http: aiohttp.ClientSession, url: str, text: str) -> int:
    async with http.post(url + "/tokenize", json={"model": MODEL, "prompt": text}) as resp:
        return int((await resp.json())["count"])


async def test_rerank_and_score(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    documents = ["prefix caching keeps KV blocks", "bananas are yellow", "the scheduler batches requests"]
    expected = sum([await count(http, url, "what is prefix caching?") + await count(http, url, d)
                    for d in documents])
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        body = {"model": MODEL, "query": "what is prefix caching?", "documents": documents, "top_n": 2}
        async with http.post(url + path, json=body) as resp:
            assert resp.status == 200
            reply = await resp.json()
        assert reply["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
        scores = [r["relevance_score"] for r in reply["results"]]
        assert len(scores) == 2 and scores == sorted(scores, reverse=True)
        assert reply["results"][0]["document"]["text"] in documents
    async with http.post(url + "/v1/score", json={"model": MODEL, "text_1": "what is prefix caching?",
                                                  "text_2": documents}) as resp:
        reply = await resp.json()
    assert [d["index"] for d in reply["data"]] == [0, 1, 2]
    assert reply["usage"]["prompt_tokens"] == expected and reply["usage"]["completion_tokens"] == 0
    async with http.post(url + "/v1/rerank", json={"model": MODEL, "query": 5, "documents": ["x"]}) as resp:
        assert resp.status == 400


async def test_count_tokens_is_the_chat_prompt(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.replicas[0].url
    messages = [{"role": "user", "content": "hello there"}]
    async with http.post(url + "/tokenize", json={"model": MODEL, "messages": [
            {"role": "system", "content": "sys"}, *messages]}) as resp:
        expected = (await resp.json())["count"]
    async with http.post(url + "/v1/messages/count_tokens",
                         json={"model": MODEL, "system": "sys", "messages": messages}) as resp:
        assert (await resp.json())["input_tokens"] == expected
    async with http.post(url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": []}) as resp:
        assert resp.status == 400 and (await resp.json())["type"] == "error"
