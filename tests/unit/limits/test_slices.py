"""Slices: when a replica admits without asking Redis, what it asks for, and the fail-open caps (no I/O)."""

from __future__ import annotations

import pytest

from extproc.limits import AdmitRequest, ConcurrencyLimit, LimitState, TokenBudget
from extproc.limits.slices import KEEP, Slices

NOW = 1_699_920_000.0  # a minute boundary (divisible by 60)
TPM = TokenBudget("t:tpm", limit=1000, window_s=60)
CONC = ConcurrencyLimit("t:conc", limit=50)


def req(rid: str, tokens: int = 100, now: float = NOW + 1, concurrency: tuple[ConcurrencyLimit, ...] = ()
        ) -> AdmitRequest:
    return AdmitRequest(rid, now, tokens, concurrency=concurrency, budgets=(TPM,))


def states(request: AdmitRequest, remaining: float, conc_remaining: float = 40.0) -> tuple[LimitState, ...]:
    out = [LimitState("concurrency", c.key, float(c.limit), conc_remaining, 0.0) for c in request.concurrency]
    return (*out, LimitState("tokens", TPM.key, 1000.0, remaining, 59.0))


def awaited(slices: Slices, request: AdmitRequest, remaining: float, *grants: int) -> list[int]:
    """`request` does not fit: it asks Redis, which admits it with `remaining` left for this replica
    and grants `grants` (per dimension); returns what it asked for."""
    assert slices.take(request) is None
    wants = slices.wants(request)
    slices.decided(request, wants, states(request, remaining), grants)
    return wants


def test_asks_for_a_slice_only_once_demand_is_two_requests_then_admits_from_it() -> None:
    slices = Slices("me", ttl_s=1.0)
    assert awaited(slices, req("a"), 900, 0) == [0]  # one request of 100: no slice worth asking for
    assert awaited(slices, req("b"), 800, 150) == [200]  # the demand of the last ~second
    local = slices.take(req("c"))
    assert local is not None and local.admitted and slices.local_total == 1
    # x-ratelimit: what was left beyond every slice (800 - 150) plus what is left of this one (50)
    assert [(s.name, s.remaining, s.reset_s) for s in local.states] == [("tokens", 700.0, 59.0)]
    assert slices.take(req("d")) is None  # 50 left: 100 does not fit


def test_a_slice_is_not_used_after_its_ttl_minus_the_guard() -> None:
    slices = Slices("me", ttl_s=1.0)
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 500)
    assert slices.take(req("c", now=NOW + 1.74)) is not None  # granted at NOW + 1, guard 0.25 s
    assert slices.take(req("d", now=NOW + 1.76)) is None


def test_every_dimension_must_fit() -> None:
    slices = Slices("me")
    both = req("a", concurrency=(CONC,))
    awaited(slices, both, 900, 0, 0)
    awaited(slices, req("b", concurrency=(CONC,)), 800, 2, 500)
    assert slices.take(req("c", concurrency=(CONC,))) is not None
    assert slices.take(req("d", concurrency=(CONC,))) is not None
    assert slices.take(req("e", concurrency=(CONC,))) is None  # 300 tokens left, but no lease
    assert slices.take(req("f")) is not None  # a request without that dimension still fits


def test_while_a_renewal_is_in_flight_the_old_slice_is_not_used_and_others_keep_the_claim() -> None:
    slices = Slices("me")
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 150)
    first = req("c", tokens=200)  # does not fit the 150: asks for a new slice
    assert slices.take(first) is None
    assert slices.wants(first) == [400]
    assert slices.take(req("d", tokens=10)) is None  # 150 were left, but they are being replaced
    other = req("e", tokens=10)
    slices.take(other)
    assert slices.wants(other) == [KEEP]  # only one call replaces a claim at a time
    slices.decided(first, [400], states(first, 500), [300])
    assert slices.take(req("f", tokens=300)) is not None


def test_a_request_refused_while_the_claim_was_replaced_takes_the_new_slice_without_counting_twice() -> None:
    slices = Slices("me")
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 150)
    first = req("c", tokens=200)
    assert slices.take(first) is None
    renewal = slices.wants(first)
    kept = req("d", tokens=100)
    assert slices.take(kept) is None and slices.wants(kept) == [KEEP]
    counts = (slices.local_total, slices.awaited_total)
    assert slices.take(kept, again=True) is None  # the renewal's reply has not come: still one awaited request
    assert (slices.local_total, slices.awaited_total) == counts
    slices.decided(first, renewal, states(first, 500), [300])
    local = slices.take(kept, again=True)  # Redis refused it (counting the new claim): it fits the new slice
    assert local is not None and local.admitted
    assert (slices.local_total, slices.awaited_total) == (counts[0] + 1, counts[1] - 1)
    assert slices.describe(NOW + 1)[0]["slice"] == 200.0


def test_a_failed_renewal_leaves_no_slice_and_the_next_call_asks_again() -> None:
    slices = Slices("me")
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 150)
    request = req("c", tokens=200)
    slices.take(request)
    wants = slices.wants(request)
    slices.failed(request, wants)
    assert slices.take(req("d", tokens=10)) is None
    later = req("e", tokens=10)
    slices.take(later)
    assert slices.wants(later) != [KEEP]


def test_a_recording_redis_did_not_cover_drops_the_slice() -> None:
    slices = Slices("me")
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 500)
    request = req("c")
    assert slices.take(request) is not None
    slices.recorded(request, [0])  # the claim had expired in Redis
    assert slices.uncovered_total == 1 and slices.take(req("d")) is None


def test_fail_open_caps_share_what_was_left_beyond_every_slice_in_that_window() -> None:
    slices = Slices("me")
    assert slices.caps(req("a"), share=0.5) == ()  # no reply yet: no cap
    awaited(slices, req("a"), 900, 0)
    awaited(slices, req("b"), 800, 200)  # 600 left beyond the slices
    assert slices.caps(req("c"), share=0.5) == (300.0,)
    slices.admitted_alone(req("c", tokens=120))
    assert slices.caps(req("d"), share=0.5) == (180.0,)
    assert slices.caps(req("e", now=NOW + 60), share=0.5) == ()  # the next window: the report was of this one


def test_keys_without_demand_or_slice_are_forgotten() -> None:
    slices = Slices("me", ttl_s=1.0)
    awaited(slices, req("a"), 900, 0)
    assert len(slices) == 1
    slices.take(AdmitRequest("b", NOW + 30, 1, budgets=(TokenBudget("t:other", 10, 60),)))
    assert len(slices) == 1  # the first key was idle for longer than the sweep interval
    with pytest.raises(ValueError):
        Slices("me", ttl_s=0.0)
