"""Anthropic Messages, OpenAI Responses, rerank/score and the tokenizer through real Envoy + service + simulator:
routing (alias rewritten), streamed and JSON, usage settled exactly from each response shape, a 429 from a token
limit and a bad request in the API's own error shape, `anthropic-version` passed through, a Responses
conversation kept on the endpoint that stores it."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch
from extproc.openai.apis import RATELIMIT_HEADERS
from extproc.tenants import hash_key
from tests.support import eventually, holds_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
STICKY = SimPool("sticky", "org/sticky", 4, profile="sticky")  # session affinity alone decides
KEYS = {"day": "tenant-day-budget", "small": "tenant-small", "free": "tenant-free", "minute": "tenant-minute"}
PATHS = {"messages": "/v1/messages", "responses": "/v1/responses", "rerank": "/v1/rerank", "score": "/v1/score",
         "tokenize": "/tokenize", "detokenize": "/detokenize", "count_tokens": "/v1/messages/count_tokens"}
DOCUMENTS = ["prefix caching keeps KV blocks", "bananas are yellow", "the scheduler batches requests"]


def keys_file() -> str:
    def tenant(name: str, limits: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "tier": "default", "limits": limits, "keys": [{"sha256": hash_key(KEYS[name])}]}

    return json.dumps({"tenants": [tenant("day", {"tokens_per_day": 1_000_000}),
                                   tenant("small", {"tokens_per_min": 120}), tenant("free", {}),
                                   tenant("minute", {"tokens_per_min": 1200})]})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("shaped")
    workdir.joinpath("keys.yaml").write_text(keys_file())
    # Without calibration a reservation is the raw estimate + the output bound: the same for the same body.
    policy = {"auth": {"mode": "api-key", "keys_file": str(workdir / "keys.yaml")},
              "limits": {"calibrate_prompt_tokens": False},
              "scheduling": {"plugins": [{"name": "session", "type": "session-affinity-scorer"},
                                         {"name": "pick", "type": "max-score-picker"}],
                             "profiles": [{"name": "sticky", "plugins": [{"pluginRef": "session", "weight": 1},
                                                                         {"pluginRef": "pick"}]}]}}
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch(group, workdir, [POOL, STICKY], extra_policy=policy, sim_args=["--profile", "fast"])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def body(api: str, tokens: int = 12, stream: bool = False, text: str = "Explain prefix caching.") -> dict[str, Any]:
    if api == "messages":
        return {"model": "chat", "max_tokens": tokens, "stream": stream,
                "system": [{"type": "text", "text": "You are terse. " * 30}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    return {"model": "chat", "max_output_tokens": tokens, "stream": stream, "instructions": "You are terse. " * 30,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]}


async def post(http: aiohttp.ClientSession, stack: Stack, api: str, key: str, payload: dict[str, Any],
               **headers: str) -> tuple[int, dict[str, str], Any]:
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}{PATHS[api]}", json=payload,
                         headers={"authorization": f"Bearer {KEYS[key]}", **headers}) as response:
        text = await response.text()
        found = {k.lower(): v for k, v in response.headers.items()}
        if response.content_type == "text/event-stream":
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
            return response.status, found, events
        return response.status, found, json.loads(text)


def usage_of(api: str, payload: Any) -> tuple[int, int]:
    """(input, output) tokens the engine reported, from a JSON body or the stream's events."""
    if isinstance(payload, list):  # events
        if api == "messages":
            usage = next(e["usage"] for e in payload if e["type"] == "message_delta")
        else:
            usage = next(e["response"]["usage"] for e in payload if e["type"] == "response.completed")
    else:
        usage = payload["usage"]
    return usage["input_tokens"], usage["output_tokens"]


async def settled_tokens(stack: Stack) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{stack.admin_url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("extproc_usage_tokens_total{") and 'pool="chat"' in line)


async def quiet_total(stack: Stack) -> float:
    """The usage total once earlier tests' access-log entries have arrived: unchanged for 0.3 s (bounded)."""

    async def steady() -> tuple[float] | None:
        first = await settled_tokens(stack)

        async def unchanged() -> bool:
            return await settled_tokens(stack) == first

        try:
            await holds_for(unchanged, "the usage total unchanged", 0.3, interval_s=0.1)
        except AssertionError:
            return None
        return (first,)

    return (await eventually(steady, "earlier tests' usage settled", timeout_s=10))[0]


async def wait_settled(stack: Stack, before: float, tokens: int) -> None:
    """Until the access log brought `tokens` more usage tokens (bounded), then exactly that many."""

    async def arrived() -> bool:
        return await settled_tokens(stack) - before >= tokens

    await eventually(arrived, f"{tokens} usage tokens settled", timeout_s=5)
    assert await settled_tokens(stack) - before == tokens


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("stream", [False, True])
async def test_routed_and_settled_exactly(stack: Stack, http: aiohttp.ClientSession, api: str, stream: bool) -> None:
    payload = body(api, tokens=40, stream=stream, text=f"{api} {stream}: explain prefix caching.")
    remaining = []
    await quiet_total(stack)
    for _ in range(3):
        before = await settled_tokens(stack)
        status, headers, reply = await post(http, stack, api, "day", payload)
        assert status == 200, reply
        assert headers["x-gateway-upstream-host"] in {f"127.0.0.1:{p}" for p in stack.sim_ports["chat"]}
        if not stream:
            assert reply["model"] == "org/chat"  # the alias was rewritten to the served name
        used = sum(usage_of(api, reply))
        remaining.append((int(headers["x-ratelimit-remaining-tokens"]), used))
        if api == "messages":  # Anthropic's names for the same numbers
            assert headers["anthropic-ratelimit-tokens-remaining"] == headers["x-ratelimit-remaining-tokens"]
            assert headers["anthropic-ratelimit-tokens-limit"] == "1000000"
        else:
            assert not any(name.startswith("anthropic-ratelimit-") for name in headers)
        await wait_settled(stack, before, used)
    # The same body reserves the same tokens each time; what changes between two admissions is exactly what
    # the exchange in between really used (its reservation was corrected to the engine's usage).
    for (first, used), (second, _) in itertools.pairwise(remaining):
        assert first - second == used


async def test_messages_errors_are_anthropic_shaped(stack: Stack, http: aiohttp.ClientSession) -> None:
    no_max = body("messages")
    del no_max["max_tokens"]
    for key, payload, status, kind in (
            ("free", no_max, 400, "invalid_request_error"),
            ("free", {**body("messages"), "messages": []}, 400, "invalid_request_error"),
            ("free", {**body("messages"), "model": "unknown"}, 404, "not_found_error"),
            # max_completion_tokens is no Messages field: the engine reads max_tokens, and so does the limit
            ("small", {**body("messages", tokens=500), "max_completion_tokens": 1}, 429, "rate_limit_error")):
        code, headers, reply = await post(http, stack, "messages", key, payload)
        assert code == status, reply
        assert reply == {"type": "error", "error": {"type": kind, "message": reply["error"]["message"]}}
        assert headers["content-type"] == "application/json"
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/messages", json=body("messages")) as response:
        assert response.status == 401
        assert (await response.json())["error"]["type"] == "authentication_error"


async def test_messages_429_carries_anthropic_ratelimit_headers(stack: Stack, http: aiohttp.ClientSession) -> None:
    """A token limit spent by earlier requests: the 429 says, in Anthropic's header names, what is left and when
    the bucket is full again (an RFC 3339 instant), as the x-ratelimit-* headers do in OpenAI's."""
    payload = body("messages", tokens=300)
    for _ in range(20):  # each admission takes >= 300 of the 1,200 tokens per minute (20 tokens/s come back)
        status, headers, reply = await post(http, stack, "messages", "minute", payload)
        if status == 429:
            break
        assert status == 200, reply
    assert status == 429, "the token limit never refused"
    assert reply["error"]["type"] == "rate_limit_error"
    assert int(headers["retry-after"]) >= 1
    assert headers["anthropic-ratelimit-tokens-limit"] == headers["x-ratelimit-limit-tokens"] == "1200"
    assert headers["anthropic-ratelimit-tokens-remaining"] == headers["x-ratelimit-remaining-tokens"]
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-tokens-reset"].replace("Z", "+00:00"))
    assert timedelta(0) <= reset - datetime.now(UTC) <= timedelta(seconds=62)


async def test_messages_metadata_user_id_keeps_a_session_on_one_endpoint(stack: Stack,
                                                                         http: aiohttp.ClientSession) -> None:
    """Claude Code's `metadata.user_id` is the session key of session affinity: every request of a session goes
    to one endpoint whatever its prompt, and the sessions spread over the pool."""
    homes: dict[str, set[str]] = {}
    for turn in range(3):
        for number in range(8):
            user_id = f"user_{number:04x}_account_acme_session_{number * 7919:08x}"
            payload = {**body("messages", text=f"turn {turn} of session {number}: what next?"), "model": "org/sticky",
                       "metadata": {"user_id": user_id}}
            status, headers, reply = await post(http, stack, "messages", "free", payload)
            assert status == 200, reply
            homes.setdefault(user_id, set()).add(headers["x-gateway-upstream-host"])
    assert all(len(hosts) == 1 for hosts in homes.values()), homes
    assert len(set.union(*homes.values())) > 1  # the key decides, not a constant


async def test_responses_errors_are_openai_shaped(stack: Stack, http: aiohttp.ClientSession) -> None:
    for key, payload, status, code in (
            ("free", {**body("responses"), "input": 7}, 400, "invalid_value"),
            ("free", {**body("responses"), "background": True}, 400, "invalid_value"),
            ("small", {**body("responses", tokens=500), "max_tokens": 1}, 429, "request_too_large_for_limit")):
        got, headers, reply = await post(http, stack, "responses", key, payload)
        assert got == status, reply
        assert reply["error"]["code"] == code
        assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_envoy_and_service_refusals_keep_the_shape(stack: Stack, http: aiohttp.ClientSession,
                                                         api: str) -> None:
    """A body over the size limit (our 413, then Envoy's local-reply mapper) in each path's shape."""
    huge = b'{"model": "chat", "pad": "' + b"x" * (4 * 1024 * 1024) + b'"}'
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}{PATHS[api]}", data=huge,
                         headers={"authorization": f"Bearer {KEYS['free']}",
                                  "content-type": "application/json"}) as response:
        assert response.status == 413
        reply = await response.json()
    if api == "messages":
        assert reply["type"] == "error" and reply["error"]["type"] == "request_too_large"
    else:
        assert reply["error"]["code"] == "request_too_large"


async def test_anthropic_version_reaches_the_engine(stack: Stack, http: aiohttp.ClientSession) -> None:
    status, headers, _ = await post(http, stack, "messages", "free", body("messages"),
                                    **{"anthropic-version": "2023-06-01"})
    assert status == 200
    upstream = headers["x-gateway-upstream-host"]
    async with http.get(f"http://{upstream}/sim/last-request", params={"path": "/v1/messages"}) as response:
        seen = {k.lower(): v for k, v in (await response.json()).items()}
    assert seen["anthropic-version"] == "2023-06-01"
    assert "authorization" in seen  # passed through untouched, as every other client header
    # Anthropic SDKs and Claude Code authenticate with x-api-key.
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}/v1/messages", json=body("messages"),
                         headers={"x-api-key": KEYS["free"], "anthropic-version": "2023-06-01"}) as response:
        assert response.status == 200
        assert (await response.json())["type"] == "message"


async def test_a_conversation_stays_on_the_endpoint_that_stores_it(stack: Stack, http: aiohttp.ClientSession) -> None:
    status, headers, first = await post(http, stack, "responses", "free",
                                        {**body("responses"), "request_id": "resp_chosen_by_client"})
    assert status == 200
    assert first["id"] != "resp_chosen_by_client" and first["id"].startswith("resp_")  # ids are the gateway's
    home = headers["x-gateway-upstream-host"]
    previous = first["id"]
    for turn in range(8):  # the simulator's store is per replica: any other endpoint would answer 404
        follow = {**body("responses", text=f"turn {turn}"), "previous_response_id": previous}
        status, headers, reply = await post(http, stack, "responses", "free", follow)
        assert status == 200, reply
        assert headers["x-gateway-upstream-host"] == home
        previous = reply["id"]
    # A forged id names no endpoint: routed as usual, and the engine that lacks it answers 404.
    forged = {**body("responses"), "previous_response_id": "resp_" + "0" * 40}
    status, _, reply = await post(http, stack, "responses", "free", forged)
    assert status == 404 and "not found" in reply["error"]["message"]


@pytest.mark.parametrize("api", ["rerank", "score"])
async def test_scoring_routed_and_settled_exactly(stack: Stack, http: aiohttp.ClientSession, api: str) -> None:
    payload: dict[str, Any] = {"model": "chat", "query": f"{api}: what is prefix caching?", "documents": DOCUMENTS}
    if api == "score":
        payload = {"model": "chat", "text_1": payload["query"], "text_2": DOCUMENTS}
    remaining = []
    await quiet_total(stack)
    for _ in range(3):
        before = await settled_tokens(stack)
        status, headers, reply = await post(http, stack, api, "day", payload)
        assert status == 200, reply
        assert reply["model"] == "org/chat"
        used = reply["usage"]["prompt_tokens"]  # rerank's usage has no completion_tokens: it generates nothing
        remaining.append((int(headers["x-ratelimit-remaining-tokens"]), used))
        await wait_settled(stack, before, used)
    for (first, used), (second, _) in itertools.pairwise(remaining):
        assert first - second == used
    too_many = {**payload, "documents": DOCUMENTS * 20} if api == "rerank" else {**payload, "text_2": DOCUMENTS * 20}
    status, _, reply = await post(http, stack, api, "small", too_many)
    assert status == 429 and reply["error"]["code"] == "request_too_large_for_limit"
    status, _, reply = await post(http, stack, api, "free", {"model": "chat", "top_n": 2})
    assert status == 400 and reply["error"]["code"] == "invalid_value"


async def test_tokenizer_is_routed_and_spends_no_token_budget(stack: Stack, http: aiohttp.ClientSession) -> None:
    long_prompt = "tokens " * 2000  # far more than the small tenant's 120 tokens per minute
    status, _, reply = await post(http, stack, "tokenize", "small", {"model": "chat", "prompt": long_prompt})
    assert status == 200 and reply["count"] >= 2000
    status, _, back = await post(http, stack, "detokenize", "small", {"model": "chat", "tokens": reply["tokens"][:5]})
    assert status == 200 and isinstance(back["prompt"], str)  # (the simulator's vocabulary is per replica)
    status, _, counted = await post(http, stack, "count_tokens", "small", {
        "model": "chat", "system": "You are terse.", "messages": [{"role": "user", "content": long_prompt}]})
    assert status == 200 and counted["input_tokens"] > 2000
    status, _, reply = await post(http, stack, "tokenize", "free", {"prompt": "no model"})
    # Two pools here (chat, sticky): which tokenizer a model-less request means is ambiguous (one pool: that one)
    assert status == 400 and reply["error"]["code"] == "missing_model"
    status, _, reply = await post(http, stack, "count_tokens", "free", {"model": "unknown", "messages": []})
    assert status == 404 and reply["error"]["type"] == "not_found_error"


FORGED = {name: "999999999" for name in RATELIMIT_HEADERS}


async def forged_post(http: aiohttp.ClientSession, stack: Stack, api: str, key: str,
                      payload: dict[str, Any]) -> tuple[int, dict[str, list[str]]]:
    """The status and every value of each rate-limit header of the answer, to a request carrying forged copies of
    all of them as request headers and in the body's `metadata`."""
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}{PATHS[api]}", json={**payload, "metadata": FORGED},
                         headers={"authorization": f"Bearer {KEYS[key]}", **FORGED}) as response:
        await response.read()
        return response.status, {name: response.headers.getall(name) for name in RATELIMIT_HEADERS
                                 if name in response.headers}


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("stream", [False, True])
async def test_ratelimit_headers_come_from_the_gateway_only(stack: Stack, http: aiohttp.ClientSession, api: str,
                                                             stream: bool) -> None:
    """Envoy adds the rate-limit headers from the service's metadata: a limited tenant gets exactly its token
    headers, once each, never the client's values; a tenant without limits gets none, whatever it sends."""
    status, found = await forged_post(http, stack, api, "day", body(api, stream=stream))
    assert status == 200
    tokens = [name for name in RATELIMIT_HEADERS if name.endswith("tokens") or "-tokens-" in name]
    assert set(found) == {name for name in tokens if api == "messages" or name.startswith("x-")}
    assert all(len(values) == 1 and values != ["999999999"] for values in found.values()), found
    assert found["x-ratelimit-limit-tokens"] == ["1000000"]
    status, found = await forged_post(http, stack, api, "free", body(api, stream=stream))
    assert status == 200 and found == {}


async def test_a_429_keeps_its_own_ratelimit_headers_once(stack: Stack, http: aiohttp.ClientSession) -> None:
    """The service's 429 (an immediate response) carries the headers itself: Envoy neither doubles nor drops
    them, and the client's forged copies appear nowhere."""
    for _ in range(20):  # each admission takes >= 300 of the 1,200 tokens per minute (20 tokens/s come back)
        status, found = await forged_post(http, stack, "messages", "minute", body("messages", tokens=300))
        if status == 429:
            break
        assert status == 200
    assert status == 429, "the token limit never refused"
    assert found["x-ratelimit-limit-tokens"] == found["anthropic-ratelimit-tokens-limit"] == ["1200"]
    assert all(len(values) == 1 and values != ["999999999"] for values in found.values()), found
