"""What the security tests share: a stack of real Envoy + service + simulator with attack-ready tenants,
HTTP helpers, and a forger of Envoy access-log (ALS) entries."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from google.protobuf import struct_pb2

from extproc.bench.stack import SimPool, Stack
from extproc.tenants import hash_key
from tests.support import debug_pools, metric_value, wait_metric

CHAT = SimPool("chat", "org/chat", 2, aliases=("chat",))
OTHER = SimPool("other", "org/other", 1, aliases=("other",))
POOLS = [CHAT, OTHER]

# tenant -> (tier, limits, models); the key of each is "key-<tenant>".
TENANTS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "cc": ("default", {"concurrency": 2}, []),  # 1: one shared x-request-id must not share a lease
    "tpm": ("default", {"tokens_per_min": 3000}, []),  # 1: nor a reservation
    "capped": ("capped", {}, []),  # 2: the tier cap in the field the engine reads
    "tpm2": ("default", {"tokens_per_min": 3000}, []),  # 2, 7: reservations per API, n and best_of
    "forge": ("default", {"tokens_per_min": 3000}, []),  # 3: refunded by a forged access-log entry?
    "attacker": ("default", {}, ["other"]),  # 4: hostile bodies for a model it may not use
    "victim": ("default", {}, []),  # 4: must not notice
    "guarded": ("guarded", {}, []),  # 5: the content guard's blind spots
    "s-alias": ("default", {"tokens_per_min": 3000}, []),  # 6: lone surrogates, three kinds of rewrite
    "s-mask": ("guarded", {"tokens_per_min": 3000}, []),
    "s-cap": ("capped", {"tokens_per_min": 3000}, []),
    "lister": ("default", {}, ["chat"]),  # 9: /v1/models shows what the tenant may use
}
CAP = 32


def key(tenant: str) -> str:
    return f"key-{tenant}"


def keys_file() -> str:
    return json.dumps({"tenants": [
        {"name": name, "tier": tier, "limits": limits, "models": models, "keys": [{"sha256": hash_key(key(name))}]}
        for name, (tier, limits, models) in TENANTS.items()]})


def policy(keys_path: str) -> dict[str, Any]:
    """Only keys main already knew: every attack is tried against the same configuration there and here."""
    return {
        "auth": {"mode": "api-key", "keys_file": keys_path},
        "tiers": {"default": {}, "capped": {"max_output_tokens": CAP}, "guarded": {}},
        "guard": {"tiers": ["guarded"], "rules": [
            {"name": "injection", "detector": "prompt_injection", "action": "deny"},
            {"name": "secret", "pattern": "forbidden phrase", "ignore_case": True, "action": "deny"},
            {"name": "email", "detector": "email", "action": "mask"},
        ]},
        "rollout": {"splits": [{"model": "canary", "backends": [{"pool": "chat", "weight": 90},
                                                                 {"pool": "other", "weight": 10}],
                                "rollout": {"canary": "other", "baseline": "chat", "steps": [10, 50],
                                            "hold_s": 3600}}]},
    }


def chat(content: Any = "hello", max_tokens: int | None = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": content}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


class Reply:
    def __init__(self, status: int, headers: dict[str, str], text: str) -> None:
        self.status, self.headers, self.text = status, headers, text

    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def code(self) -> str | None:
        try:
            return str(self.json()["error"]["code"])
        except (ValueError, KeyError, TypeError):
            return None

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.text[:300]!r})"


async def post(http: aiohttp.ClientSession, stack: Stack, tenant: str | None, body: Any,
               path: str = "/v1/chat/completions", **headers: str) -> Reply:
    sent = {**headers, **({"authorization": f"Bearer {key(tenant)}"} if tenant else {})}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(f"http://127.0.0.1:{stack.envoy_port}{path}", data=data,
                         headers={"content-type": "application/json", **sent}) as response:
        return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, await response.text())


async def remaining_tokens(http: aiohttp.ClientSession, stack: Stack, tenant: str) -> int:
    """The tenant's tokens left this minute (x-ratelimit-remaining-tokens of a 1-token request, plus it)."""
    reply = await post(http, stack, tenant, chat("x", max_tokens=1))
    assert reply.status == 200, reply
    return int(reply.headers["x-ratelimit-remaining-tokens"])


async def settled(http: aiohttp.ClientSession, admin_url: str, before: float, bound_s: float = 5.0) -> None:
    """Wait until the service has taken one more access-log entry than `before` (entries come ~0.1 s late)."""
    await wait_metric(http, admin_url, "extproc_upstream_responses_total", above=before, timeout_s=bound_s)


async def entries(http: aiohttp.ClientSession, admin_url: str) -> float:
    return await metric_value(http, admin_url, "extproc_upstream_responses_total")


async def in_flight(http: aiohttp.ClientSession, admin_url: str) -> int:
    """Requests holding an endpoint lease now, over every pool (decided and not yet finished)."""
    return sum(e["in_flight"] for endpoints in (await debug_pools(http, admin_url)).values() for e in endpoints)


def forged_entry(request_id: str, reservation: list[Any], prompt: int,
                 completion: int) -> accesslog_pb2.HTTPAccessLogEntry:
    """What Envoy would report for a finished exchange: our metadata (the reservation) and usage."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.request.request_id = request_id
    entry.response.response_code.value = 200
    metadata = entry.common_properties.metadata.filter_metadata
    ours = struct_pb2.Struct()
    ours.update({"request_id": request_id, "pool": "chat", "reservation": json.dumps(reservation)})
    metadata["extproc"].CopyFrom(ours)
    usage = struct_pb2.Struct()
    usage.update({"prompt_tokens": prompt, "completion_tokens": completion})
    metadata["extproc.usage"].CopyFrom(usage)
    return entry


async def send_access_log(grpc_port: int, entries_: list[accesslog_pb2.HTTPAccessLogEntry],
                          token: str | None = None) -> grpc.StatusCode:
    """Stream `entries_` to the service's ALS like an attacker on the network would (no client certificate)."""
    first = als_pb2.StreamAccessLogsMessage(
        identifier=als_pb2.StreamAccessLogsMessage.Identifier(node=base_pb2.Node(id="forger"), log_name="extproc"))
    first.http_logs.log_entry.extend(entries_)
    metadata = (("x-extproc-token", token),) if token else None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = als_pb2_grpc.AccessLogServiceStub(channel)
        try:
            await stub.StreamAccessLogs(iter([first]), metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK
