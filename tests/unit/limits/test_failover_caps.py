"""Fail-open decisions capped by the replica's share of what the primary last said was left beyond every
slice. A MemoryStore plays the primary (it reports real states), with a real `Slices` table fed by its
replies; the fallback's tokens are not added to the primary afterwards."""

from __future__ import annotations

import pytest

from extproc.limits import (
    AdmitRequest,
    AdmitResult,
    FailoverStore,
    MemoryStore,
    Reservation,
    StoreTimeout,
    StoreUnavailable,
    TokenBudget,
)
from extproc.limits.failover import SlicedStore
from extproc.limits.slices import Slices

T0 = 1_699_920_000.0  # a minute boundary
TPM = TokenBudget("t:tpm", 900, 60)


class FlakyPrimary:
    """A MemoryStore that can be switched down (every call raises StoreUnavailable), with the slices table
    a RedisStore keeps (it never grants a slice here: only the fail-open caps are at stake)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.slices: Slices | None = Slices("me")
        self.down = False
        self.late = False  # admissions run (here: at once), but their replies come too late
        self.kept: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("scripted outage")

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        self._check()
        self.slices.take(request)
        wants = self.slices.wants(request)
        result = await self.inner.admit(request)
        if self.late:
            self.slices.failed(request, wants)
            if result.admitted:  # a RedisStore would undo it unless the failover keeps it
                self.inner.release_now(Reservation.of(request), request.now)
                self.inner.settle_now(Reservation.of(request), 0, request.now)
            raise StoreTimeout("scripted late reply")
        self.slices.decided(request, wants, result.states, [0] * len(wants))
        return result

    async def admit_local(self, request: AdmitRequest) -> AdmitResult | None:
        return self.slices.take(request)

    def keep(self, request: AdmitRequest) -> None:
        self.kept.append(request.request_id)
        self.inner.admit_now(request)  # as if the undo had not happened

    async def release(self, reservation: Reservation, now: float) -> None:
        self._check()
        await self.inner.release(reservation, now)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        self._check()
        await self.inner.settle(reservation, actual_tokens, now)

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
    assert isinstance(primary, SlicedStore)
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
    assert (await store.admit(req("c", T0 + 3, 10))).admitted  # reported 900 - 500 - 10 = 390 left
    assert await tokens_in_primary(primary, T0 + 3) == 510  # b is not added to the primary
    primary.down = True
    assert not (await store.admit(req("d", T0 + 4, 131))).admitted  # a third of the new report: 130
    assert (await store.admit(req("e", T0 + 4, 80))).admitted  # and the local share: 300 - 130 = 170 left


async def test_record_failure_marks_the_primary_down() -> None:
    store, _, _ = make()
    store.record_failure("release", "WRONGTYPE")
    assert not store.primary_up and store.failures_total == 1


async def test_a_late_admission_the_fallback_admits_is_kept_by_the_primary_and_released_in_both() -> None:
    store, primary, fallback = make()
    assert (await store.admit(req("a", T0 + 1, 600))).admitted  # 300 left
    primary.late = True
    assert (await store.admit(req("b", T0 + 2, 90))).admitted  # a third of 300 alone: kept in the primary
    assert not (await store.admit(req("c", T0 + 3, 20))).admitted  # over the cap: not kept (undone)
    assert primary.kept == ["b"] and store.primary_up  # two late replies within 100 ms: not down yet
    assert await tokens_in_primary(primary, T0 + 3) == 690
    primary.late = False
    await store.settle(Reservation.of(req("b", T0 + 2, 90)), 30, T0 + 4)
    assert await tokens_in_primary(primary, T0 + 4) == 630  # settled in the primary as well
    assert fallback.sizes()["pending"] == 0
