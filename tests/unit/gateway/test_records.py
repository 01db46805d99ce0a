from __future__ import annotations

from extproc.config import parse_policy
from extproc.gateway import Caller, RequestHead, RequestIds, Resolved, RuntimeHolder
from extproc.gateway.records import route_metadata, who
from extproc.openai import Api, parse_request
from extproc.tenants import ANONYMOUS, Tenant

POOLS = "pools: [{name: chat, model: m, endpoints: ['10.0.0.1:8000']}]\n"


def caller(policy_text: str, tenant: Tenant = ANONYMOUS, request_id: str = "") -> Caller:
    head = RequestHead("POST", "/v1/chat/completions", {"x-request-id": "envoy-id"})
    runtime = RuntimeHolder(parse_policy(policy_text)).current
    return Caller(request_id, head, runtime, Api.CHAT, tenant, runtime.policy.tiers["default"], "", False)


def resolved(runtime_caller: Caller, prompt_estimate: int = 0) -> Resolved:
    request = parse_request(Api.CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
                            max_bytes=4096, max_depth=8)
    return Resolved(request, runtime_caller.runtime.pools["chat"].config, False, prompt_estimate, prompt_estimate,
                    prompt_estimate + 16)


def test_who_names_only_what_is_known() -> None:
    keys = POOLS + "auth: {mode: api-key, keys_file: /dev/null}\n"
    # Our id, never the client's x-request-id (the audit log takes that one from the request header).
    assert who(caller(keys, request_id="r0")) == {"request_id": "r0"}  # an anonymous caller of a keyed policy
    assert who(caller(POOLS, request_id="r0")) == {"request_id": "r0", "tenant": "anonymous"}
    acme = Tenant("acme", "default", frozenset(), key="ci")
    known = caller(keys, acme, request_id="r1")
    assert who(known, resolved(known)) == {"request_id": "r1", "tenant": "acme", "key": "ci", "model": "m"}


def test_request_ids_are_ours_and_unique_per_process() -> None:
    one, other = RequestIds(), RequestIds()
    ids = {one() for _ in range(1000)}
    assert len(ids) == 1000 and all(one.mine(i) and not other.mine(i) for i in ids)
    assert one.replica_id != other.replica_id


def test_route_metadata_adds_pool_and_the_raw_prompt_estimate() -> None:
    routed = caller(POOLS, request_id="r2")
    assert route_metadata(routed, resolved(routed, 42), "chat", None) == {
        "request_id": "r2", "tenant": "anonymous", "model": "m", "pool": "chat", "prompt_estimate": 42}
