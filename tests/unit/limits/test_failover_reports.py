"""Fail-open decisions capped by what the primary last reported, and fallback tokens replayed into the
primary once it is back. A MemoryStore plays the primary (it reports real states and takes charges)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from extproc.limits import (
    AdmitRequest,
    AdmitResult,
    FailoverStore,
    MemoryStore,
    Reservation,
    StoreUnavailable,
    TokenBudget,
)
from extproc.limits.failover import Reports
from extproc.limits.types import WindowCharge

T0 = 1_699_920_000.0  # a minute boundary
TPM = TokenBudget("t:tpm", 900, 60)


class FlakyPrimary:
    """A MemoryStore that can be switched down (every call raises StoreUnavailable)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.down = False
        self.charges: list[list[WindowCharge]] = []

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("scripted outage")

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        self._check()
        return await self.inner.admit(request)

    async def release(self, reservation: Reservation, now: float) -> None:
        self._check()
        await self.inner.release(reservation, now)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        self._check()
        await self.inner.settle(reservation, actual_tokens, now)

    async def charge(self, charges: Sequence[WindowCharge], now: float) -> None:
        self._check()
        self.charges.append(list(charges))
        await self.inner.charge(charges, now)

    async def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(share: float = 1 / 3, clock: Clock | None = None) -> tuple[FailoverStore, FlakyPrimary, MemoryStore]:
    primary, fallback = FlakyPrimary(), MemoryStore()
    # probe_backoff_s=0: every admission asks the primary, so switching it up/down is immediate
    store = FailoverStore(primary, fallback, "fail-open", fallback_share=share, probe_backoff_s=0.0,
                          clock=clock or Clock())
    return store, primary, fallback


def req(rid: str, at: float, tokens: int, budget: TokenBudget = TPM) -> AdmitRequest:
    return AdmitRequest(rid, at, tokens, budgets=(budget,))


async def tokens_in_primary(primary: FlakyPrimary, at: float) -> float:
    """Tokens the primary counts in the sliding window at `at` (limit - remaining)."""
    probe = await primary.inner.admit(req("probe", at, 0))
    return TPM.limit - probe.states[0].remaining


async def test_fallback_is_capped_by_its_share_of_what_the_primary_last_reported() -> None:
    store, primary, _ = make()
    assert (await store.admit(req("a", T0 + 1, 800))).admitted  # the primary has 100 left
    primary.down = True
    # The share alone (300) would admit 200; this replica may take a third of the 100 reported left, so
    # three replicas deciding alone together stay within it.
    local = await store.admit(req("b", T0 + 2, 20))
    assert local.admitted
    refused = await store.admit(req("c", T0 + 3, 20))
    assert (refused.admitted, refused.refused_by) == (False, "tokens:t:tpm")
    assert refused.retry_after_s == pytest.approx(57.0, abs=1e-3)  # the cap ends with the window
    assert (await store.admit(req("d", T0 + 4, 13))).admitted  # 20 + 13 of the 33.3
    assert not (await store.admit(req("e", T0 + 4, 1))).admitted
    assert store.degraded_admits_total == 4


async def test_a_refusing_primary_leaves_nothing_to_the_fallback() -> None:
    store, primary, _ = make()
    assert (await store.admit(req("a", T0 + 1, 900))).admitted
    assert not (await store.admit(req("b", T0 + 2, 10))).admitted  # refused by the primary: 0 left
    primary.down = True
    assert not (await store.admit(req("c", T0 + 3, 10))).admitted
    assert store.owed_tokens == 0


async def test_the_cap_applies_only_in_the_window_it_was_reported_in() -> None:
    store, primary, _ = make()
    assert (await store.admit(req("a", T0 + 1, 850))).admitted
    primary.down = True
    assert not (await store.admit(req("b", T0 + 2, 100))).admitted  # capped at 50
    # next window: only the local share (300) applies; the previous window still weighs in locally
    # (nothing was admitted locally), so 300 fit
    assert (await store.admit(req("c", T0 + 60, 300))).admitted
    assert not (await store.admit(req("d", T0 + 61, 10))).admitted


async def test_a_new_report_resets_what_was_admitted_locally_since() -> None:
    store, primary, _ = make()
    assert (await store.admit(req("a", T0 + 1, 500))).admitted  # 400 left
    primary.down = True
    assert not (await store.admit(req("b0", T0 + 2, 140))).admitted  # over a third of the 400
    assert (await store.admit(req("b", T0 + 2, 130))).admitted  # cap 133.3 -> 3.3 left locally
    primary.down = False
    assert (await store.admit(req("c", T0 + 3, 10))).admitted  # reported 900 - 500 - 10 = 390 left (b not yet
    await store.replayed()  # replayed when c was admitted)
    assert await tokens_in_primary(primary, T0 + 3) == 640  # b was replayed into the primary
    primary.down = True
    assert not (await store.admit(req("d", T0 + 4, 131))).admitted  # a third of the new report: 130
    assert (await store.admit(req("e", T0 + 4, 80))).admitted  # and the local share: 300 - 130 = 170 left


async def test_fallback_tokens_are_replayed_once_the_primary_is_back() -> None:
    store, primary, _ = make(share=1.0)
    primary.down = True
    assert (await store.admit(req("a", T0 + 1, 100))).admitted
    assert (await store.admit(req("b", T0 + 2, 50))).admitted
    await store.settle(Reservation.of(req("a", T0 + 1, 100)), 70, T0 + 5)  # a used 30 fewer than reserved
    assert store.owed_tokens == 120
    primary.down = False
    assert (await store.admit(req("c", T0 + 10, 1))).admitted
    await store.replayed()
    assert primary.charges == [[WindowCharge("t:tpm", 60, int(T0) // 60, 120)]]
    assert (store.owed_tokens, store.replayed_tokens_total) == (0, 120)
    assert await tokens_in_primary(primary, T0 + 10) == 121
    # b settles after the replay: the correction is owed, and replayed after the next primary success
    await store.settle(Reservation.of(req("b", T0 + 2, 50)), 20, T0 + 11)
    assert store.owed_tokens == -30
    assert (await store.admit(req("d", T0 + 12, 1))).admitted
    await store.replayed()
    assert await tokens_in_primary(primary, T0 + 12) == 92


async def test_a_failed_replay_is_kept_for_the_next_success() -> None:
    store, primary, _ = make(share=1.0)
    primary.down = True
    assert (await store.admit(req("a", T0 + 1, 100))).admitted
    failing = primary.charge

    async def refuse(charges: Sequence[WindowCharge], now: float) -> None:
        raise StoreUnavailable("charge failed")

    primary.down = False
    primary.charge = refuse  # type: ignore[method-assign]
    assert (await store.admit(req("b", T0 + 2, 1))).admitted
    await store.replayed()
    assert store.owed_tokens == 100 and store.failures_total == 2
    primary.charge = failing  # type: ignore[method-assign]
    assert (await store.admit(req("c", T0 + 3, 1))).admitted
    await store.replayed()
    assert store.owed_tokens == 0 and await tokens_in_primary(primary, T0 + 3) == 102


async def test_owed_tokens_of_windows_that_no_longer_count_are_dropped() -> None:
    store, primary, _ = make(share=1.0)
    primary.down = True
    assert (await store.admit(req("a", T0 + 1, 100))).admitted
    primary.down = False
    assert (await store.admit(req("b", T0 + 125, 1))).admitted  # two windows later
    await store.replayed()
    assert primary.charges == [] and store.owed_tokens == 0


def test_reports_ignore_results_without_budget_states_and_forget_old_windows() -> None:
    reports = Reports()
    request = req("a", T0 + 1, 10)
    reports.remember(request, AdmitResult(admitted=True))  # e.g. a primary that reports nothing
    assert len(reports) == 0 and reports.caps(request) == ()
    result = MemoryStore().admit_now(request)
    reports.remember(request, result)
    assert reports.caps(req("b", T0 + 2, 10)) == (890.0,)
    assert reports.caps(req("b", T0 + 2, 10), share=0.5) == (445.0,)
    reports.sweep(T0 + 59)
    assert len(reports) == 1
    reports.sweep(T0 + 60)
    assert len(reports) == 0


async def test_record_failure_marks_the_primary_down() -> None:
    store, _, _ = make()
    store.record_failure("release", "WRONGTYPE")
    assert not store.primary_up and store.failures_total == 1


async def test_owed_tokens_are_forgotten_when_their_window_no_longer_counts_even_while_down() -> None:
    clock = Clock()
    store, primary, _ = make(share=1.0, clock=clock)
    primary.down = True
    assert (await store.admit(req("a", T0 + 1, 100))).admitted
    assert store.owed_tokens == 100
    clock.now += 125.0  # the sweep runs every 10 s
    assert (await store.admit(req("b", T0 + 125, 1))).admitted  # two windows later: the sweep drops a's
    assert store.owed_tokens == 1
