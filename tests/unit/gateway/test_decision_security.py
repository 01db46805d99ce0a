"""The decision path against hostile clients: own request ids, reservations as large as what the engine
may generate, cheap refusals before parsing, /v1/models per tenant, internal errors charge nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extproc.gateway import RequestHead, Respond, Route, resolve
from extproc.gateway.auth import Authenticator
from extproc.limits.types import AdmitRequest, AdmitResult
from extproc.openai import parse_document
from extproc.tenants import KeyRing, hash_key
from tests.unit.gateway.harness import Harness

POLICY = """\
pools:
  - {name: chat, model: org/chat, aliases: [chat], endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]}
  - {name: other, model: org/other, endpoints: ["10.0.1.1:8000"]}
"""
TENANTS = {"tenants": [
    {"name": "cc", "limits": {"concurrency": 1}, "keys": [{"sha256": hash_key("k-cc")}]},
    {"name": "rate", "limits": {"requests_per_s": 1}, "keys": [{"sha256": hash_key("k-rate")}]},
    {"name": "tpm", "limits": {"tokens_per_min": 100000}, "keys": [{"sha256": hash_key("k-tpm")}]},
    {"name": "chat-only", "models": ["chat"], "keys": [{"sha256": hash_key("k-chat-only")}]},
    {"name": "free", "keys": [{"sha256": hash_key("k-free")}]},
]}


class Clocks:
    def __init__(self) -> None:
        self.now, self.cpu = 0.0, 0.0


def make(tmp_path: Path, extra: str = "") -> tuple[Harness, Clocks]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(TENANTS))
    clocks = Clocks()
    gateway = Harness(POLICY + f"auth: {{mode: api-key, keys_file: {keys}}}\n" + extra, clock=lambda: clocks.now,
                      authenticator=Authenticator(KeyRing.from_file(keys, {"default"})), replica_id="r0",
                      cpu_clock=lambda: clocks.cpu)
    return gateway, clocks


def head(key: str, path: str = "/v1/chat/completions", method: str = "POST", **headers: str) -> RequestHead:
    return RequestHead(method, path, {"authorization": f"Bearer {key}", **headers})


def chat(**extra: Any) -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def status(decision: object) -> tuple[int, str]:
    assert isinstance(decision, Respond), decision
    return decision.status, json.loads(decision.body)["error"]["code"]


def test_request_ids_are_ours_never_the_clients(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    ids = set()
    for _ in range(3):
        exchange, _ = gateway.headers(head("k-tpm", **{"x-request-id": "same"}))
        admission = gateway.body(exchange, chat(max_tokens=5))
        assert isinstance(admission, AdmitRequest)
        ids.add(admission.request_id)
        route = gateway.send(exchange, AdmitResult(True))
        assert isinstance(route, Route) and route.metadata is not None
        assert route.metadata["request_id"] == admission.request_id != "same"
        assert json.loads(route.metadata["reservation"])[0] == admission.request_id
    assert len(ids) == 3 and all(gateway.gateway.request_ids.mine(i) for i in ids)


def test_reservation_covers_every_sequence_and_unbounded_output_is_bounded(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path, "limits: {default_output_tokens: 100}\n")
    exchange, _ = gateway.headers(head("k-tpm"))
    admission = gateway.body(exchange, chat(max_tokens=50, n=4))
    assert isinstance(admission, AdmitRequest) and 200 < admission.tokens < 210
    gateway.finish(exchange)
    exchange, _ = gateway.headers(head("k-tpm"))
    admission = gateway.body(exchange, chat())  # no bound: the engine could run to its context
    assert isinstance(admission, AdmitRequest) and 100 < admission.tokens < 110
    route = gateway.send(exchange, AdmitResult(True))
    assert isinstance(route, Route) and route.body is not None
    assert json.loads(route.body)["max_tokens"] == 100  # so the bound is written into the body


def test_unlimited_tenants_keep_unbounded_requests_as_sent(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    exchange, _ = gateway.headers(head("k-free"))
    route = gateway.body(exchange, chat(model="org/chat"))
    assert isinstance(route, Route) and route.body is None


def test_concurrency_held_here_refuses_at_the_headers(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    holder, _ = gateway.headers(head("k-cc"))
    admission = gateway.body(holder, chat(max_tokens=5))
    assert isinstance(admission, AdmitRequest)
    assert isinstance(gateway.send(holder, AdmitResult(True)), Route)
    _, early = gateway.headers(head("k-cc"))
    assert status(early) == (429, "rate_limit_exceeded")  # before any body is parsed
    gateway.finish(holder)
    _, early = gateway.headers(head("k-cc"))
    assert early is None


def test_a_refused_request_rate_refuses_at_the_headers_until_the_retry_time(tmp_path: Path) -> None:
    gateway, clocks = make(tmp_path)
    exchange, _ = gateway.headers(head("k-rate"))
    admission = gateway.body(exchange, chat(max_tokens=5))
    assert isinstance(admission, AdmitRequest)
    rate_key = admission.rates[0].key
    refusal = gateway.send(exchange, AdmitResult(False, refused_by=f"requests:{rate_key}", retry_after_s=2.0))
    assert status(refusal) == (429, "rate_limit_exceeded")
    _, early = gateway.headers(head("k-rate"))
    assert status(early) == (429, "rate_limit_exceeded")
    clocks.now = 2.5
    _, early = gateway.headers(head("k-rate"))
    assert early is None


@pytest.mark.parametrize("clock", ["cpu", "now"])
def test_parse_budget_refuses_a_tenant_that_spent_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      clock: str) -> None:
    # Every decision of this test holds the loop 150 ms: as CPU time ("cpu"), or as wall clock with no CPU time of
    # ours ("now": a service that gets a fraction of a core, every other stream waiting): the budget counts both.
    gateway, clocks = make(tmp_path, "bounds: {tenant_parse_ms_per_s: 100, tenant_parse_burst_ms: 200, "
                                     "decision_cpu_ms: 0}\n")

    def expensive(*args: Any, **kwargs: Any) -> Any:
        setattr(clocks, clock, getattr(clocks, clock) + 0.15)
        return parse_document(*args, **kwargs)

    monkeypatch.setattr(resolve, "parse_document", expensive)
    for _ in range(2):
        exchange, early = gateway.headers(head("k-chat-only"))
        assert early is None
        assert isinstance(gateway.body(exchange, chat()), Route)
        gateway.finish(exchange)
    _, early = gateway.headers(head("k-chat-only"))
    assert status(early) == (429, "processing_budget_exceeded")
    assert early is not None and ("retry-after", "1") in early.headers
    exchange, _ = gateway.headers(head("k-tpm"))  # another tenant is not affected
    assert isinstance(gateway.body(exchange, chat(max_tokens=5)), AdmitRequest)
    clocks.now += 10.0
    _, early = gateway.headers(head("k-chat-only"))
    assert early is None


def test_declared_bodies_are_charged_at_the_headers_and_given_back_if_none_is_decided(tmp_path: Path) -> None:
    # 100 ms/s, a 200 ms bucket; a 1 MB body is reckoned at 30 ms (30 ns a byte until large bodies were measured).
    gateway, _ = make(tmp_path, "bounds: {tenant_parse_ms_per_s: 100, tenant_parse_burst_ms: 200}\n")
    large = {"content-length": "1000000"}
    waiting = []
    for _ in range(7):  # concurrent uploads: 7 x 30 ms reserved while the bucket is not yet below 0
        exchange, early = gateway.headers(head("k-chat-only", **large))
        assert early is None
        waiting.append(exchange)
    _, early = gateway.headers(head("k-chat-only", **large))
    assert status(early) == (429, "processing_budget_exceeded")  # before any of the bodies arrived
    exchange, early = gateway.headers(head("k-tpm", **large))  # another tenant is not affected
    assert early is None
    gateway.finish(exchange)
    for exchange in waiting:  # the clients went away: no decision, the reservations come back
        gateway.finish(exchange)
    for _ in range(6):
        exchange, early = gateway.headers(head("k-chat-only", **large))
        assert early is None
        gateway.finish(exchange)


def test_a_decision_is_not_refused_for_its_own_reservation(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path, "bounds: {tenant_parse_ms_per_s: 100, tenant_parse_burst_ms: 200, "
                                "max_body_bytes: 33554432}\n")
    exchange, early = gateway.headers(head("k-chat-only", **{"content-length": "25000000"}))  # 750 ms reserved
    assert early is None
    assert isinstance(gateway.body(exchange, chat()), Route)  # its real cost replaced the reservation
    gateway.finish(exchange)
    _, early = gateway.headers(head("k-chat-only"))
    assert early is None


def test_the_cost_of_a_body_byte_is_learned_from_large_bodies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway, clocks = make(tmp_path, "bounds: {tenant_parse_ms_per_s: 100, tenant_parse_burst_ms: 200, "
                                     "decision_cpu_ms: 0}\n")

    def slow(*args: Any, **kwargs: Any) -> Any:
        clocks.now += 0.1  # 100 ms for a 100 KB body: 1 us a byte, 33 x the first guess
        return parse_document(*args, **kwargs)

    monkeypatch.setattr(resolve, "parse_document", slow)
    exchange, _ = gateway.headers(head("k-tpm"))
    assert isinstance(gateway.body(exchange, chat(max_tokens=5, user="x" * 100_000)), AdmitRequest)
    gateway.finish(exchange)
    clocks.now += 10.0  # every bucket full again
    _, early = gateway.headers(head("k-chat-only", **{"content-length": "1200000"}))
    assert early is None  # charged 1.2 MB x (0.2 x 1 us + 0.8 x 30 ns) = ~269 ms: the bucket is now below 0
    _, early = gateway.headers(head("k-chat-only", **{"content-length": "1000"}))
    assert status(early) == (429, "processing_budget_exceeded")


def test_explain_spends_no_parse_budget(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path, "bounds: {tenant_parse_ms_per_s: 100, tenant_parse_burst_ms: 200}\n")
    for _ in range(10):
        gateway.gateway.explain(head("k-chat-only", **{"content-length": "1000000"}), chat())
    _, early = gateway.headers(head("k-chat-only"))
    assert early is None


def test_decision_cpu_budget_is_checked_between_stages(tmp_path: Path) -> None:
    gateway, clocks = make(tmp_path, "bounds: {decision_cpu_ms: 50}\n")
    stage = gateway.gateway.stages.resolve
    original = stage._within_budget

    def slow_stage(caller: Any, cpu_started: float) -> None:
        clocks.cpu += 0.06
        original(caller, cpu_started)

    stage._within_budget = slow_stage  # type: ignore[method-assign]
    exchange, _ = gateway.headers(head("k-chat-only"))
    assert status(gateway.body(exchange, chat())) == (413, "request_too_complex")


def test_a_model_the_tenant_may_not_use_is_refused_before_the_body_is_walked(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path, "bounds: {max_messages: 2}\n")
    exchange, _ = gateway.headers(head("k-chat-only"))
    body = json.dumps({"model": "org/other", "messages": [{"role": "user", "content": "x"}] * 3}).encode()
    assert status(gateway.body(exchange, body)) == (404, "model_not_found")  # not 400 (too many)


def test_models_listing_is_authenticated_and_filtered(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    _, anonymous = gateway.headers(RequestHead("GET", "/v1/models", {}))
    assert status(anonymous) == (401, "invalid_api_key")
    _, listed = gateway.headers(head("k-chat-only", "/v1/models", "GET"))
    assert isinstance(listed, Respond) and listed.status == 200
    assert [m["id"] for m in json.loads(listed.body)["data"]] == ["chat"]
    _, everything = gateway.headers(head("k-tpm", "/v1/models", "GET"))
    assert isinstance(everything, Respond)
    assert {m["id"] for m in json.loads(everything.body)["data"]} == {"org/chat", "chat", "org/other"}


def test_an_internal_error_after_routing_charges_nothing(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    exchange, _ = gateway.headers(head("k-tpm"))
    assert isinstance(gateway.body(exchange, chat(max_tokens=5)), AdmitRequest)
    assert isinstance(gateway.send(exchange, AdmitResult(True)), Route)
    gateway.gateway.failed(exchange)
    assert exchange.outcome == "internal_error"
    held = gateway.finish(exchange)
    assert held is not None and held.budgets  # the server settles it at 0 (outcome is not "routed")


def test_anthropic_clients_authenticate_with_x_api_key(tmp_path: Path) -> None:
    gateway, _ = make(tmp_path)
    body = json.dumps({"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()
    exchange, early = gateway.headers(RequestHead("POST", "/v1/messages", {"x-api-key": "k-free"}))
    assert early is None and exchange.caller is not None and exchange.caller.tenant.name == "free"
    assert isinstance(gateway.body(exchange, body), Route)
    for headers in ({"x-api-key": "wrong"}, {"x-api-key": ""}, {},
                    # Authorization decides when present: a bad one is not rescued by a good x-api-key
                    {"authorization": "Bearer wrong", "x-api-key": "k-free"},
                    {"authorization": "Basic k-free", "x-api-key": "k-free"}):
        _, early = gateway.headers(RequestHead("POST", "/v1/messages", headers))
        assert early is not None and early.status == 401
        assert json.loads(early.body)["error"]["type"] == "authentication_error"
