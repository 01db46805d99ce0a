"""Real Envoy + our service + the simulated fleet on 127.0.0.1: routing, errors, streaming, failure mode; every test
once per request body mode of policy mode (buffered: the body after the headers reply; streamed: the body right
behind the headers, the headers reply held until the body is decided; prebuffered: Envoy's buffer filter holds the
whole body, then headers and body go together) and per front end of the gRPC port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack
from tests.support import eventually, launch_stack

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = SimPool("chat", "org/chat-8b", 3, aliases=("chat", "gpt-4o-mini"))
SMALL = SimPool("small", "org/small-1b", 1, aliases=("small",))


@pytest_asyncio.fixture(loop_scope="module", scope="module",
                        params=[f"{mode}/{front}" for front in ("grpcio", "lean")
                                for mode in ("buffered", "streamed", "prebuffered")])
async def stack(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Stack, ProcessGroup]]:
    """Once per request body mode and front end (grpc.aio, or the lean HTTP/2 one: extproc/server/h2/)."""
    body_mode, front_end = request.param.split("/")
    workdir: Path = tmp_path_factory.mktemp(f"spine-{body_mode}-{front_end}")
    async with ProcessGroup(workdir / "logs") as group:
        yield await launch_stack(group, workdir, [CHAT, SMALL], sim_args=["--stream-chunk-tokens", "2"],
                                 envoy={"request_body_mode": body_mode},
                                 patch=lambda document: document["service"].update(front_end=front_end)), group


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def url(stack: Stack, path: str) -> str:
    return f"http://127.0.0.1:{stack.envoy_port}{path}"


def chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, **extra}


def ports(stack: Stack, pool: str) -> set[str]:
    return {f"127.0.0.1:{p}" for p in stack.sim_ports[pool]}


async def test_routes_by_model_and_alias(stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession) -> None:
    s, _ = stack
    for model, pool in (("gpt-4o-mini", "chat"), ("org/chat-8b", "chat"), ("small", "small")):
        async with http.post(url(s, "/v1/chat/completions"), json=chat_body(model)) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
            assert response.headers["x-gateway-upstream-host"] in ports(s, pool)
            # the alias was rewritten to the served name, which the simulator checks
            assert body["model"] in {CHAT.model, SMALL.model}
            assert body["usage"]["completion_tokens"] > 0


async def test_envoy_honours_the_endpoint_we_pick(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    async with http.get(f"{s.admin_url}/debug/pools") as response:
        before = {e["address"]: e["picked_total"] for e in (await response.json())["pools"]["chat"]}
    served: dict[str, int] = {}
    for _ in range(12):
        async with http.post(url(s, "/v1/completions"), json={"model": "chat", "prompt": "x", "max_tokens": 2}) as r:
            assert r.status == 200
            host = r.headers["x-gateway-upstream-host"]
            served[host] = served.get(host, 0) + 1
    async with http.get(f"{s.admin_url}/debug/pools") as response:
        after = {e["address"]: e["picked_total"] for e in (await response.json())["pools"]["chat"]}
    picked = {a: after[a] - before[a] for a in after if after[a] != before[a]}
    assert picked == served
    assert len(served) == 3  # sequential requests rotate over idle endpoints


async def test_explain_matches_the_real_decision(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    for n in range(4):
        body = chat_body("gpt-4o-mini", messages=[{"role": "system", "content": f"group {n} " * 200},
                                                  {"role": "user", "content": "hi"}])
        async with http.post(f"{s.admin_url}/debug/explain",
                             json={"path": "/v1/chat/completions", "body": body}) as response:
            explained = await response.json()
        assert explained["decision"] == "route" and explained["profile"] == "default"
        assert len(explained["scores"]) == 3 and explained["body_rewritten"] is True
        async with http.post(url(s, "/v1/chat/completions"), json=body) as response:
            assert response.status == 200
            assert response.headers["x-gateway-upstream-host"] == explained["endpoints"][0]


async def test_client_cannot_choose_pool_or_endpoint(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    small_endpoint = next(iter(ports(s, "small")))
    headers = {"x-gateway-pool": "small", "x-gateway-destination-endpoint": small_endpoint}
    for _ in range(4):
        async with http.post(url(s, "/v1/chat/completions"), json=chat_body("chat"), headers=headers) as response:
            assert response.status == 200
            assert response.headers["x-gateway-upstream-host"] in ports(s, "chat")


async def test_streaming_passes_through_intact(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    body = chat_body("chat", stream=True, max_tokens=12, stream_options={"include_usage": True})
    async with http.post(url(s, "/v1/chat/completions"), json=body) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert text
    assert usage and usage[-1]["completion_tokens"] == 12


async def test_the_exchange_holds_its_endpoint_until_it_ends(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    """The ext_proc stream lasts as long as the HTTP exchange (the service releases at its end): with a streamed
    body Envoy would close it once the body is answered, unless the response trailers are asked for."""
    s, _ = stack

    async def in_flight() -> int:
        async with http.get(f"{s.admin_url}/debug/pools") as response:
            return sum(e["in_flight"] for e in (await response.json())["pools"]["chat"])

    async def released() -> bool:
        return await in_flight() == 0

    body = chat_body("chat", stream=True, max_tokens=400, ignore_eos=True)
    async with http.post(url(s, "/v1/chat/completions"), json=body) as response:
        assert response.status == 200
        await response.content.readline()  # the first event: the exchange is running
        assert await in_flight() == 1
        await response.read()
    await eventually(released, "the endpoint released")


# ext_proc messages Envoy sends per routed JSON request with a body (headers, body chunks; the response sends none
# without trailers): streamed adds the empty end-of-stream chunk Envoy's HTTP/1 codec follows the data with.
MESSAGES_PER_REQUEST = {"buffered": 2, "streamed": 3, "prebuffered": 2}


async def envoy_counter(http: aiohttp.ClientSession, s: Stack, suffix: str) -> int:
    async with http.get(f"{s.envoy_admin_url}/stats?filter=ext_proc") as response:
        return sum(int(line.rpartition(": ")[2]) for line in (await response.text()).splitlines()
                   if line.partition(":")[0].endswith(suffix))


async def test_ext_proc_messages_per_request(stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession) -> None:
    """Prebuffered costs what buffered costs (2 messages each way) in one round trip: the body reaches the service
    whole, in one chunk, without waiting for the headers reply."""
    s, _ = stack
    mode = s.policy.envoy.request_body_mode
    words = " ".join(f"w{n}" for n in range(2_000))  # ~12 KB, like a long prompt
    before = await envoy_counter(http, s, ".stream_msgs_sent")
    for _ in range(10):
        async with http.post(url(s, "/v1/chat/completions"),
                             json=chat_body("chat", messages=[{"role": "user", "content": words}])) as response:
            assert response.status == 200, await response.text()
            await response.read()
    sent = await envoy_counter(http, s, ".stream_msgs_sent") - before
    assert sent == 10 * MESSAGES_PER_REQUEST[mode]


async def test_a_200_kb_prompt_is_routed_on_its_body_and_arrives_whole(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    words = " ".join(f"w{n}" for n in range(40_000))  # ~200 KB, more tokens than the engine takes
    body = chat_body("gpt-4o-mini", messages=[{"role": "user", "content": words}])
    assert len(json.dumps(body)) > 200_000
    async with http.post(url(s, "/v1/chat/completions"), json=body) as response:
        routed = response.headers["x-gateway-upstream-host"]
        via_envoy = (response.status, await response.json())
    assert routed in ports(s, "chat")  # routed on the body's model alias
    direct = {**body, "model": CHAT.model}  # the alias rewritten, as the service does
    async with http.post(f"http://{routed}/v1/chat/completions", json=direct) as response:
        # the engine's own answer (its context-length error names the prompt's token count): the same body
        assert via_envoy == (response.status, await response.json())


async def expect_error(response: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.headers["content-type"].startswith("application/json")
    error = (await response.json())["error"]
    assert error["code"] == code
    assert set(error) >= {"message", "type", "code"}
    return dict(error)


async def test_error_codes(stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession) -> None:
    s, _ = stack
    chat_url = url(s, "/v1/chat/completions")
    async with http.post(chat_url, data=b'{"model": ') as r:
        await expect_error(r, 400, "invalid_json")
    async with http.post(chat_url, json={"messages": []}) as r:
        await expect_error(r, 400, "missing_model")
    async with http.post(chat_url, data=b'{"model": "chat", "messages": [{"content": "\xff"}]}') as r:
        await expect_error(r, 400, "invalid_json")
    # (the model comes first: a request for a model it may not use costs no walk over its body)
    async with http.post(chat_url, data=b'{"model": "chat", "a":' + b'{"a":' * 100 + b"1" + b"}" * 101) as r:
        await expect_error(r, 400, "invalid_json")
    async with http.post(chat_url, json=chat_body("no-such-model")) as r:
        await expect_error(r, 404, "model_not_found")
    async with http.post(url(s, "/v2/unknown"), json=chat_body("chat")) as r:
        await expect_error(r, 404, "unknown_url")
    async with http.get(chat_url) as r:
        await expect_error(r, 405, "method_not_allowed")
    big = json.dumps(chat_body("chat", pad="x" * (s.policy.bounds.max_body_bytes + 10))).encode()
    async with http.post(chat_url, data=big) as r:
        await expect_error(r, 413, "request_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: Envoy's own buffer limit answers
        for _ in range(80):
            yield b"x" * 65536

    async with http.post(chat_url, data=chunks()) as r:
        await expect_error(r, 413, "request_too_large")
    async with http.get(url(s, "/v1/models")) as r:
        assert r.status == 200
        assert {m["id"] for m in (await r.json())["data"]} >= {"chat", "small", CHAT.model}


async def test_nothing_leaked_after_errors(stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession) -> None:
    s, _ = stack
    async with http.get(f"{s.admin_url}/debug/pools") as response:
        pools = (await response.json())["pools"]
    assert all(e["in_flight"] == 0 for pool in pools.values() for e in pool)


async def test_dead_endpoint_is_retried_on_a_fallback(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, _ = stack
    victim, sibling = s.sim_ports["chat"][0], s.sim_ports["chat"][1]
    faults = f"http://127.0.0.1:{sibling}/sim/faults?port={victim}"  # the victim's own port will be closed
    async with http.post(faults, json={"refuse": True}) as r:
        assert r.status == 200
    try:
        for _ in range(9):
            async with http.post(url(s, "/v1/chat/completions"), json=chat_body("chat")) as response:
                assert response.status == 200
                assert response.headers["x-gateway-upstream-host"] != f"127.0.0.1:{victim}"
    finally:
        async with http.post(faults, json={"refuse": False}) as r:
            assert r.status == 200


async def test_fail_closed_when_service_is_down(
    stack: tuple[Stack, ProcessGroup], http: aiohttp.ClientSession
) -> None:
    s, group = stack
    await group.stop(s.children["service"])
    async with http.post(url(s, "/v1/chat/completions"), json=chat_body("chat"),
                         headers={"x-gateway-pool": "chat"}) as response:
        await expect_error(response, 500, "gateway_error")
