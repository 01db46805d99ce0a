"""The audit log (policy `audit.path`): one JSON line per request, written by real Envoy from our dynamic
metadata and its own fields, for routed, refused (429) and unauthenticated (401) requests. Keys never
appear in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, launch
from extproc.tenants import hash_key

pytestmark = pytest.mark.asyncio

POOL = SimPool("chat", "org/chat", 2, aliases=("chat",))
LABELLED = "audit-key-labelled-0123456789"
UNLABELLED = "audit-key-unlabelled-9876543210"
WRONG = "audit-key-wrong-5555555555"


def keys_file() -> str:
    return json.dumps({"tenants": [
        {"name": "acme", "keys": [{"sha256": hash_key(LABELLED), "label": "ci"}]},
        {"name": "tiny", "limits": {"tokens_per_min": 50}, "keys": [{"sha256": hash_key(UNLABELLED)}]},
    ]})


async def post(http: aiohttp.ClientSession, port: int, key: str, payload: dict[str, Any],
               request_id: str) -> tuple[int, Any]:
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id, "user-agent": "audit-test/1"}
    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=payload, headers=headers) as response:
        text = await response.text()
        if payload.get("stream"):
            return response.status, text
        return response.status, json.loads(text)


def chat(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": "audit me"}], "max_tokens": max_tokens,
            "stream": stream}


def stream_usage(text: str) -> dict[str, int]:
    """The usage chunk the service asked vLLM for (include_usage), as Envoy's sse_to_metadata reads it."""
    for line in text.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[len("data: "):]).get("usage")
            if usage:
                return dict(usage)
    return {}


async def test_audit_lines_for_routed_refused_and_unauthenticated_requests(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(keys_file())
    audit = tmp_path / "audit.log"
    policy = {"auth": {"mode": "api-key", "keys_file": str(tmp_path / "keys.yaml")}, "audit": {"path": str(audit)}}
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch(group, tmp_path, [POOL], extra_policy=policy, sim_args=["--profile", "fast"])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            ok_status, ok = await post(http, stack.envoy_port, LABELLED, chat(16), "r-ok")
            stream_status, streamed = await post(http, stack.envoy_port, LABELLED, chat(12, stream=True), "r-stream")
            refused_status, refusal = await post(http, stack.envoy_port, UNLABELLED, chat(200), "r-refused")
            denied_status, denial = await post(http, stack.envoy_port, WRONG, chat(8), "r-denied")
    # Envoy writes its file logs in batches; stopping it (leaving the group) flushed them.
    assert (ok_status, stream_status, refused_status, denied_status) == (200, 200, 429, 401)
    text = audit.read_text()
    for key in (LABELLED, UNLABELLED, WRONG, hash_key(LABELLED), hash_key(UNLABELLED)):
        assert key not in text
    # The client's x-request-id is logged as client_request_id; request_id is ours (the accounting key).
    lines = {line["client_request_id"]: line for line in map(json.loads, text.splitlines())}
    assert set(lines) == {"r-ok", "r-stream", "r-refused", "r-denied"}
    ours = [line["request_id"] for line in lines.values()]
    assert len(set(ours)) == 4 and not set(ours) & set(lines)
    sims = {f"127.0.0.1:{port}" for port in stack.sim_ports["chat"]}

    routed = lines["r-ok"]
    assert {k: routed[k] for k in ("tenant", "key", "model", "pool", "status", "method", "path", "user_agent")} == {
        "tenant": "acme", "key": "ci", "model": "chat", "pool": "chat", "status": 200, "method": "POST",
        "path": "/v1/chat/completions", "user_agent": "audit-test/1"}
    assert routed["endpoint"] in sims
    assert (routed["prompt_tokens"], routed["completion_tokens"]) == (
        ok["usage"]["prompt_tokens"], ok["usage"]["completion_tokens"])
    assert routed["duration_ms"] >= routed["upstream_first_byte_ms"] >= 0
    assert routed["client"] == "127.0.0.1"

    stream = lines["r-stream"]  # the service asked for the usage chunk because the audit log wants it
    usage = stream_usage(streamed)
    assert (stream["status"], stream["tenant"], stream["endpoint"] in sims) == (200, "acme", True)
    assert (stream["prompt_tokens"], stream["completion_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])

    refused = lines["r-refused"]  # over its tokens per minute: refused before any upstream
    unlabelled = f"sha256:{hash_key(UNLABELLED)[:12]}"
    assert (refused["status"], refused["tenant"], refused["key"]) == (429, "tiny", unlabelled)
    assert refused["model"] == "chat" and refused["endpoint"] is None and refused["pool"] is None
    assert refused["details"] == refusal["error"]["code"]

    denied = lines["r-denied"]  # unknown key: nobody to name
    assert (denied["status"], denied["tenant"], denied["key"]) == (401, None, None)
    assert denied["details"] == denial["error"]["code"] == "invalid_api_key"
