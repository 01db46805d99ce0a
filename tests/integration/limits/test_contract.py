"""The same cases against MemoryStore and RedisStore: both must implement one semantics exactly."""

from __future__ import annotations

import pytest

from extproc.limits import (
    ConcurrencyLimit,
    RateLimit,
    Reservation,
    Store,
    TokenBudget,
)
from tests.support import held, req, state

pytestmark = pytest.mark.integration

T0 = 1_699_920_000.0  # a multiple of 86400: minute and day windows both start here
RPS = RateLimit("{a}:rps", rate=2.0, burst=3.0)
TPM = TokenBudget("{a}:tpm", limit=100, window_s=60)


async def tokens_left(store: Store, at: float, budget: TokenBudget = TPM) -> float:
    return state(await store.admit(req("probe", at, 0, budgets=(budget,))), budget_name(budget)).remaining


def budget_name(budget: TokenBudget) -> str:
    return {60: "tokens", 86400: "tokens-day"}.get(budget.window_s, f"tokens-{budget.window_s}s")


async def test_bucket_burst_then_refill(store: Store) -> None:
    for i, left in enumerate([2.0, 1.0, 0.0]):
        result = await store.admit(req(f"r{i}", T0, rates=(RPS,)))
        assert result.admitted and state(result, "requests").remaining == left
    assert state(result, "requests").reset_s == pytest.approx(1.5, abs=1e-5)
    refused = await store.admit(req("r3", T0, rates=(RPS,)))
    assert (refused.admitted, refused.refused_by) == (False, "requests:{a}:rps")
    assert refused.retry_after_s == pytest.approx(0.5, abs=1e-5)
    assert (await store.admit(req("r4", T0 + 0.25, rates=(RPS,)))).retry_after_s == pytest.approx(0.25, abs=1e-5)
    assert (await store.admit(req("r5", T0 + 0.5, rates=(RPS,)))).admitted
    later = await store.admit(req("r6", T0 + 100, rates=(RPS,)))
    assert later.admitted and state(later, "requests").remaining == 2.0  # refill stops at burst


async def test_bucket_ignores_a_clock_behind(store: Store) -> None:
    one = RateLimit("{a}:one", rate=1.0, burst=1.0)
    assert (await store.admit(req("a", T0 + 1, rates=(one,)))).admitted
    behind = await store.admit(req("b", T0 + 0.5, rates=(one,)))
    assert not behind.admitted and behind.retry_after_s == pytest.approx(1.0, abs=1e-5)
    assert (await store.admit(req("c", T0 + 2, rates=(one,)))).admitted


async def test_concurrency_leases_release_and_expiry(store: Store) -> None:
    cc = ConcurrencyLimit("{a}:cc", limit=2, lease_ttl_s=30)
    a, b = req("a", T0, conc=(cc,)), req("b", T0 + 1, conc=(cc,))
    assert state(await store.admit(a), "concurrency").remaining == 1.0
    assert state(await store.admit(b), "concurrency").remaining == 0.0
    refused = await store.admit(req("c", T0 + 2, conc=(cc,)))
    assert (refused.admitted, refused.refused_by, refused.retry_after_s) == (False, "concurrency:{a}:cc", 1.0)
    await store.release(held(a), T0 + 3)
    c = req("c", T0 + 3, conc=(cc,))
    assert (await store.admit(c)).admitted
    await store.release(held(a), T0 + 4)  # idempotent: frees nothing more
    assert not (await store.admit(req("d", T0 + 4, conc=(cc,)))).admitted
    # b's lease expires at T0 + 31, c's at T0 + 33
    assert (await store.admit(req("d", T0 + 31.5, conc=(cc,)))).admitted
    late = await store.admit(req("e", T0 + 32.5, conc=(cc,)))
    assert not late.admitted and late.retry_after_s == pytest.approx(0.5, abs=1e-5)  # c expires before 1 s


async def test_concurrency_same_request_keeps_its_lease(store: Store) -> None:
    one = ConcurrencyLimit("{a}:one", limit=1)
    assert (await store.admit(req("x", T0, conc=(one,)))).admitted
    assert (await store.admit(req("x", T0 + 1, conc=(one,)))).admitted
    assert not (await store.admit(req("y", T0 + 1, conc=(one,)))).admitted


async def test_sliding_window_estimate_and_boundary(store: Store) -> None:
    first = await store.admit(req("a", T0 + 30, 60, budgets=(TPM,)))
    assert first.admitted
    assert (state(first, "tokens").remaining, state(first, "tokens").reset_s) == (40.0, 30.0)
    over = await store.admit(req("b", T0 + 59, 41, budgets=(TPM,)))
    # at T0 + 61 the full current window (60) has slid out enough: 60 * (1 - 1/60) + 41 = 100
    assert (over.admitted, over.refused_by) == (False, "tokens:{a}:tpm")
    assert over.retry_after_s == pytest.approx(2.0, abs=1e-5)
    assert (await store.admit(req("c", T0 + 59, 40, budgets=(TPM,)))).admitted  # exactly the limit
    # new window at T0 + 60: previous = 100 counts fully, then slides out linearly
    boundary = await store.admit(req("d", T0 + 60, 1, budgets=(TPM,)))
    assert not boundary.admitted and boundary.retry_after_s == pytest.approx(0.6, abs=1e-5)
    assert await tokens_left(store, T0 + 90) == 50.0
    assert not (await store.admit(req("e", T0 + 90, 51, budgets=(TPM,)))).admitted
    assert (await store.admit(req("f", T0 + 90, 50, budgets=(TPM,)))).admitted
    assert await tokens_left(store, T0 + 90) == 0.0


async def test_retry_after_is_exactly_when_it_fits(store: Store) -> None:
    assert (await store.admit(req("a", T0 + 30, 60, budgets=(TPM,)))).admitted
    refused = await store.admit(req("b", T0 + 60, 50, budgets=(TPM,)))
    assert refused.retry_after_s == pytest.approx(10.0, abs=1e-5)
    assert not (await store.admit(req("b", T0 + 69.9, 50, budgets=(TPM,)))).admitted
    assert (await store.admit(req("b", T0 + 60 + refused.retry_after_s, 50, budgets=(TPM,)))).admitted


async def test_retry_after_is_capped_at_the_window(store: Store) -> None:
    assert (await store.admit(req("a", T0 + 1, 100, budgets=(TPM,)))).admitted
    refused = await store.admit(req("b", T0 + 2, 100, budgets=(TPM,)))
    assert refused.retry_after_s == 60.0


async def test_a_request_over_the_whole_limit_is_too_large(store: Store) -> None:
    refused = await store.admit(req("a", T0, 101, budgets=(TPM,)))
    assert (refused.admitted, refused.refused_by, refused.retry_after_s) == (False, "tokens:{a}:tpm:too-large", 60.0)
    assert await tokens_left(store, T0) == 100.0


async def test_day_budget_is_named_and_counted(store: Store) -> None:
    day = TokenBudget("{a}:tpd", limit=1000, window_s=86400)
    result = await store.admit(req("a", T0 + 3600, 30, budgets=(TPM, day)))
    assert [s.name for s in result.states] == ["tokens", "tokens-day"]
    assert state(result, "tokens-day").remaining == 970.0
    assert state(result, "tokens-day").reset_s == 86400 - 3600


async def test_settle_down_up_and_idempotent(store: Store) -> None:
    a = req("a", T0 + 10, 50, budgets=(TPM,))
    assert (await store.admit(a)).admitted
    await store.settle(held(a), 20, T0 + 11)
    assert await tokens_left(store, T0 + 12) == 80.0
    await store.settle(held(a), 90, T0 + 12)  # second settle: no change
    assert await tokens_left(store, T0 + 12) == 80.0
    b = req("b", T0 + 13, 40, budgets=(TPM,))
    assert (await store.admit(b)).admitted
    await store.settle(held(b), 70, T0 + 14)
    assert await tokens_left(store, T0 + 14) == 10.0


async def test_settle_corrects_the_window_it_was_charged_to(store: Store) -> None:
    a = req("a", T0 + 50, 60, budgets=(TPM,))
    assert (await store.admit(a)).admitted
    assert await tokens_left(store, T0 + 70) == 50.0  # 60 * (1 - 10/60) still counts
    await store.settle(held(a), 0, T0 + 70)
    assert await tokens_left(store, T0 + 70) == 100.0


async def test_settle_of_something_never_admitted_changes_nothing(store: Store) -> None:
    assert (await store.admit(req("a", T0, 30, budgets=(TPM,)))).admitted
    ghost = Reservation("ghost", 30, (), (TPM,), T0)
    await store.settle(ghost, 0, T0 + 1)
    refused = req("big", T0 + 1, 101, budgets=(TPM,))
    assert not (await store.admit(refused)).admitted
    await store.settle(held(refused), 0, T0 + 1)  # refused admissions reserve nothing to settle
    assert await tokens_left(store, T0 + 1) == 70.0


async def test_refusal_is_all_or_nothing(store: Store) -> None:
    rps = RateLimit("{a}:rps5", rate=1.0, burst=5.0)
    one = ConcurrencyLimit("{a}:one", limit=1)
    holder = req("holder", T0, 0, rates=(rps,), conc=(one,), budgets=(TPM,))
    assert (await store.admit(holder)).admitted
    refused = await store.admit(req("x", T0, 30, rates=(rps,), conc=(one,), budgets=(TPM,)))
    assert (refused.admitted, refused.refused_by) == (False, "concurrency:{a}:one")
    assert [(s.name, s.remaining) for s in refused.states] == [("requests", 4.0), ("concurrency", 0.0),
                                                               ("tokens", 100.0)]
    await store.release(held(holder), T0)
    after = await store.admit(req("y", T0, 0, rates=(rps,), conc=(one,), budgets=(TPM,)))
    assert after.admitted  # x took no lease
    assert state(after, "requests").remaining == 3.0  # x took no bucket token
    assert state(after, "tokens").remaining == 100.0  # x reserved nothing


async def test_refused_by_names_the_first_and_waits_for_the_longest(store: Store) -> None:
    one = RateLimit("{a}:slow", rate=1.0, burst=1.0)
    assert (await store.admit(req("a", T0 + 1, 100, rates=(one,), budgets=(TPM,)))).admitted
    refused = await store.admit(req("b", T0 + 1, 100, rates=(one,), budgets=(TPM,)))
    assert refused.refused_by == "requests:{a}:slow"
    assert refused.retry_after_s == 60.0  # the budget needs longer than the bucket's 1 s
    assert [s.name for s in refused.states] == ["requests", "tokens"]


async def test_concurrency_state_reports_live_leases(store: Store) -> None:
    cc = ConcurrencyLimit("{a}:cc3", limit=3, lease_ttl_s=0.5)
    result = await store.admit(req("a", T0, conc=(cc,)))
    assert (state(result, "concurrency").limit, state(result, "concurrency").remaining) == (3.0, 2.0)
    assert state(result, "concurrency").reset_s == pytest.approx(0.5, abs=1e-5)
    later = await store.admit(req("b", T0 + 1, conc=(cc,)))
    assert state(later, "concurrency").remaining == 2.0  # a's lease expired
