from __future__ import annotations

from extproc.config import parse_policy
from extproc.gateway import RequestHead, Snapshot
from extproc.gateway.exchange import Exchange, RequestIds, route_metadata, who
from extproc.tenants import ANONYMOUS, Tenant

POOLS = "pools: [{name: chat, model: m, endpoints: ['10.0.0.1:8000']}]\n"


def exchange(policy_text: str, tenant: Tenant = ANONYMOUS, request_id: str = "") -> Exchange:
    head = RequestHead("POST", "/v1/chat/completions", {"x-request-id": "envoy-id"})
    found = Exchange(head, Snapshot.build(parse_policy(policy_text), 1), None, 0.0, tenant=tenant,
                     request_id=request_id)
    return found


def test_who_names_only_what_is_known() -> None:
    keys = POOLS + "auth: {mode: api-key, keys_file: /dev/null}\n"
    # Our id, never the client's x-request-id (the audit log takes that one from the request header).
    assert who(exchange(keys, request_id="r0")) == {"request_id": "r0"}  # not authenticated (yet): no tenant
    assert who(exchange(POOLS, request_id="r0")) == {"request_id": "r0", "tenant": "anonymous"}
    acme = Tenant("acme", "default", frozenset(), key="ci")
    known = exchange(keys, acme, request_id="r1")
    known.model = "chat"
    assert who(known) == {"request_id": "r1", "tenant": "acme", "key": "ci", "model": "chat"}


def test_request_ids_are_ours_and_unique_per_process() -> None:
    one, other = RequestIds(), RequestIds()
    ids = {one() for _ in range(1000)}
    assert len(ids) == 1000 and all(one.mine(i) and not other.mine(i) for i in ids)
    assert one.replica_id != other.replica_id


def test_route_metadata_adds_pool_and_the_raw_prompt_estimate() -> None:
    routed = exchange(POOLS, request_id="r2")
    routed.pool, routed.prompt_estimate = "chat", 42
    assert route_metadata(routed) == {"request_id": "r2", "tenant": "anonymous", "pool": "chat",
                                      "prompt_estimate": 42}
