"""MemoryStore semantics with explicit times: no event loop, no sleeps."""

from __future__ import annotations

import copy
import random

import pytest

from extproc.limits import (
    ConcurrencyLimit,
    LimitState,
    MemoryStore,
    RateLimit,
    TokenBudget,
)
from tests.support import held, req, state

T0 = 1_699_920_000.0
RPS = RateLimit("t:rps", rate=4.0, burst=2.0)
CC = ConcurrencyLimit("t:cc", limit=2, lease_ttl_s=10.0)
TPM = TokenBudget("t:tpm", limit=1000, window_s=60)


def tokens_left(store: MemoryStore, at: float) -> float:
    return state(store.admit_now(req("probe", at, budgets=(TPM,))), "tokens").remaining


def test_bucket_burst_refill_and_retry() -> None:
    store = MemoryStore()
    assert store.admit_now(req("a", T0, rates=(RPS,))).admitted
    second = store.admit_now(req("b", T0, rates=(RPS,)))
    assert second.admitted and state(second, "requests") == LimitState("requests", "t:rps", 2.0, 0.0, 0.5)
    refused = store.admit_now(req("c", T0 + 0.1, rates=(RPS,)))
    assert refused.refused_by == "requests:t:rps" and refused.retry_after_s == pytest.approx(0.15, abs=1e-5)
    assert store.admit_now(req("c", T0 + 0.25, rates=(RPS,))).admitted


def test_leases_expire_and_release_is_idempotent() -> None:
    store = MemoryStore()
    a, b = req("a", T0, conc=(CC,)), req("b", T0 + 4, conc=(CC,))
    assert store.admit_now(a).admitted and store.admit_now(b).admitted
    refused = store.admit_now(req("c", T0 + 9.5, conc=(CC,)))
    assert refused.retry_after_s == pytest.approx(0.5, abs=1e-5)  # a expires at T0 + 10, sooner than 1 s
    assert store.admit_now(req("c", T0 + 10, conc=(CC,))).admitted  # expiry <= now no longer counts
    store.release_now(held(b), T0 + 11)
    store.release_now(held(b), T0 + 11)
    assert store.sizes()["leases"] == 1


def test_leases_expired_out_of_order_are_found_before_refusing() -> None:
    store = MemoryStore()
    long_ttl, short_ttl = ConcurrencyLimit("t:mix", 2, lease_ttl_s=100), ConcurrencyLimit("t:mix", 2, lease_ttl_s=1)
    assert store.admit_now(req("long", T0, conc=(long_ttl,))).admitted
    assert store.admit_now(req("short", T0, conc=(short_ttl,))).admitted
    assert store.admit_now(req("next", T0 + 2, conc=(long_ttl,))).admitted  # "short" expired behind "long"


def test_window_weights_the_previous_window() -> None:
    store = MemoryStore()
    assert store.admit_now(req("a", T0 + 45, 600, budgets=(TPM,))).admitted
    assert tokens_left(store, T0 + 59.999) == 400.0
    assert tokens_left(store, T0 + 60) == 400.0  # boundary: previous counts fully
    assert tokens_left(store, T0 + 75) == 550.0  # a quarter slid out
    assert tokens_left(store, T0 + 120) == 1000.0  # two windows later it is gone


def test_window_retry_after_covers_both_windows() -> None:
    store = MemoryStore()
    assert store.admit_now(req("a", T0 + 10, 900, budgets=(TPM,))).admitted
    refused = store.admit_now(req("b", T0 + 20, 300, budgets=(TPM,)))
    # needs 900 * (1 - f) + 300 <= 1000 in the next window: f = 2/9, at T0 + 60 + 13.33
    assert refused.retry_after_s == pytest.approx(60 + 60 * 2 / 9 - 20, abs=1e-5)
    assert not store.admit_now(req("b", T0 + 73, 300, budgets=(TPM,))).admitted
    assert store.admit_now(req("b", T0 + 20 + refused.retry_after_s, 300, budgets=(TPM,))).admitted


def test_too_large_is_refused_and_charges_nothing() -> None:
    store = MemoryStore()
    refused = store.admit_now(req("a", T0, 1001, budgets=(TPM,)))
    assert (refused.refused_by, refused.retry_after_s) == ("tokens:t:tpm:too-large", 60.0)
    assert tokens_left(store, T0) == 1000.0 and store.sizes()["pending"] == 1  # only the probe


def test_settle_clamps_a_window_at_zero() -> None:
    store = MemoryStore()
    a = req("a", T0 + 1, 500, budgets=(TPM,))
    assert store.admit_now(a).admitted
    store._windows[("t:tpm", 60, int(T0) // 60)] = 100  # e.g. rebuilt lower
    store.settle_now(held(a), 0, T0 + 2)
    assert store._windows[("t:tpm", 60, int(T0) // 60)] == 0


def test_settle_late_in_an_expired_window_changes_nothing() -> None:
    store = MemoryStore()
    a = req("a", T0 + 1, 500, budgets=(TPM,))
    assert store.admit_now(a).admitted
    store.settle_now(held(a), 5000, T0 + 150)
    assert tokens_left(store, T0 + 150) == 1000.0


def test_settle_is_idempotent_and_negative_usage_counts_as_zero() -> None:
    store = MemoryStore()
    a = req("a", T0 + 1, 500, budgets=(TPM,))
    assert store.admit_now(a).admitted
    store.settle_now(held(a), -7, T0 + 2)
    store.settle_now(held(a), 900, T0 + 2)
    assert tokens_left(store, T0 + 2) == 1000.0


def test_refusal_changes_nothing() -> None:
    store = MemoryStore()
    one = ConcurrencyLimit("t:one", 1)
    assert store.admit_now(req("a", T0, 0, conc=(one,))).admitted
    before = store.sizes()
    refused = store.admit_now(req("b", T0, 10, rates=(RPS,), conc=(one,), budgets=(TPM,)))
    assert not refused.admitted and store.sizes() == before
    assert [s.remaining for s in refused.states] == [2.0, 0.0, 1000.0]


def test_zero_limits_refuse() -> None:
    store = MemoryStore()
    closed = store.admit_now(req("a", T0, 1, conc=(ConcurrencyLimit("t:zero", 0),)))
    assert closed.refused_by == "concurrency:t:zero" and closed.retry_after_s == 1.0


def test_memory_is_bounded_by_sweeping() -> None:
    store = MemoryStore(sweep_interval_s=5.0)
    for i in range(200):
        r = req(f"r{i}", T0 + i * 0.01, 1, rates=(RateLimit(f"t{i}:rps", 10, 10),),
                conc=(ConcurrencyLimit(f"t{i}:cc", 5, lease_ttl_s=30),), budgets=(TokenBudget(f"t{i}:tpm", 100, 60),))
        assert store.admit_now(r).admitted
    assert store.sizes() == {"buckets": 200, "leases": 200, "windows": 200, "pending": 200}
    store.admit_now(req("late", T0 + 200))  # past every TTL: one sweep drops everything
    assert store.sizes() == {"buckets": 0, "leases": 0, "windows": 0, "pending": 0}


async def test_async_methods_delegate() -> None:
    store = MemoryStore()
    a = req("a", T0, 10, conc=(CC,), budgets=(TPM,))
    assert (await store.admit(a)).admitted
    await store.settle(held(a), 5, T0 + 1)
    await store.release(held(a), T0 + 1)
    await store.close()
    assert store.sizes()["leases"] == 0 and tokens_left(store, T0 + 1) == 995.0


def test_retrying_after_retry_after_succeeds() -> None:
    """Property: a refused request resent exactly `retry_after_s` later, with no other traffic, fits
    (except for concurrency, which waits for a release, and too-large requests, which never fit)."""
    rng = random.Random(7)
    store = MemoryStore()
    rate, budget = RateLimit("p:rps", rate=3.0, burst=5.0), TokenBudget("p:tpm", limit=5000, window_s=60)
    now, checked = T0 + 17.3, 0
    for i in range(2000):
        now += rng.expovariate(8.0)
        request = req(f"r{i}", now, rng.randint(1, 1500), rates=(rate,), budgets=(budget,))
        result = store.admit_now(request)
        if result.admitted:
            if rng.random() < 0.5:
                store.settle_now(held(request), rng.randint(0, 2000), now + rng.random())
            continue
        retry = req(f"retry{i}", now + result.retry_after_s, request.tokens, rates=(rate,), budgets=(budget,))
        assert copy.deepcopy(store).admit_now(retry).admitted, (result, retry)
        early = req(f"early{i}", now + result.retry_after_s * 0.999 - 1e-4, request.tokens, rates=(rate,),
                    budgets=(budget,))
        assert not copy.deepcopy(store).admit_now(early).admitted or result.retry_after_s < 1e-3
        checked += 1
    assert checked > 100
