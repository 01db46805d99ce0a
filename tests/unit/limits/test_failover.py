"""FailoverStore policy with scripted primaries and an injected clock."""

from __future__ import annotations

import logging

import pytest

from extproc.limits import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    FailoverStore,
    MemoryStore,
    RateLimit,
    Reservation,
    StoreTimeout,
    StoreUnavailable,
    TokenBudget,
)
from extproc.limits.failover import share_of

T0 = 1_699_920_000.0
CC = ConcurrencyLimit("t:cc", 1)
TPM = TokenBudget("t:tpm", 100, 60)


class ScriptedStore:
    """A primary that is up, down (raises StoreUnavailable) or late (its deadline passed: StoreTimeout)."""

    def __init__(self) -> None:
        self.mode = "up"
        self.calls: list[str] = []

    async def _act(self, call: str) -> None:
        self.calls.append(call)
        if self.mode == "down":
            raise StoreUnavailable("scripted outage")
        if self.mode == "late":
            raise StoreTimeout("scripted late reply")

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        await self._act(f"admit {request.request_id}")
        return AdmitResult(admitted=True)

    async def release(self, reservation: Reservation, now: float) -> None:
        await self._act(f"release {reservation.request_id}")

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        await self._act(f"settle {reservation.request_id}")

    async def close(self) -> None:
        self.calls.append("close")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def req(rid: str, tokens: int = 10) -> AdmitRequest:
    return AdmitRequest(rid, T0, tokens, concurrency=(CC,), budgets=(TPM,))


def held(rid: str, tokens: int = 10) -> Reservation:
    return Reservation(rid, tokens, (CC,), (TPM,), T0)


def make(policy: str = "fail-open") -> tuple[FailoverStore, ScriptedStore, MemoryStore, Clock]:
    primary, fallback, clock = ScriptedStore(), MemoryStore(), Clock()
    store = FailoverStore(primary, fallback, policy, retry_after_s=2.0,  # type: ignore[arg-type]
                          probe_backoff_s=1.0, clock=clock)
    return store, primary, fallback, clock


async def test_up_primary_decides() -> None:
    store, primary, fallback, _ = make()
    assert (await store.admit(req("a"))).admitted
    await store.settle(held("a"), 5, T0)
    await store.release(held("a"), T0)
    assert primary.calls == ["admit a", "settle a", "release a"] and fallback.sizes()["leases"] == 0


async def test_fail_open_uses_the_fallback_and_routes_its_reservations_back(caplog: pytest.LogCaptureFixture) -> None:
    store, primary, fallback, _ = make()
    primary.mode = "down"
    with caplog.at_level(logging.WARNING):
        assert (await store.admit(req("a"))).admitted
        refused = await store.admit(req("b"))  # the fallback's own concurrency limit of 1
    assert refused.refused_by == "concurrency:t:cc"
    assert (store.failures_total, store.primary_up, store.degraded_admits_total) == (1, False, 2)
    assert primary.calls == ["admit a"]  # b did not wait on the primary
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["limits store down"]
    primary.mode = "up"
    await store.release(held("a"), T0)
    await store.settle(held("a"), 100, T0)
    assert primary.calls == ["admit a"] and fallback.sizes() == {"buckets": 0, "leases": 0, "windows": 1,
                                                                 "pending": 0}


async def test_fail_closed_refuses() -> None:
    store, primary, _, _ = make("fail-closed")
    primary.mode = "down"
    result = await store.admit(req("a"))
    assert (result.admitted, result.refused_by, result.retry_after_s) == (False, "store_unavailable", 2.0)


async def test_probe_after_backoff_and_recover(caplog: pytest.LogCaptureFixture) -> None:
    store, primary, _, clock = make()
    primary.mode = "down"
    with caplog.at_level(logging.WARNING):
        await store.admit(req("a"))
        clock.now += 0.5
        await store.admit(req("b"))
        clock.now += 0.6  # backoff over: the next admission probes, and fails
        await store.admit(req("c"))
        assert primary.calls == ["admit a", "admit c"] and store.failures_total == 2
        clock.now += 1.0
        primary.mode = "up"
        await store.admit(req("d"))
        await store.admit(req("e"))
    assert store.primary_up and primary.calls[-2:] == ["admit d", "admit e"]
    assert [r.getMessage().split(" ")[:4] for r in caplog.records] == [["limits", "store", "down", "(admit"],
                                                                       ["limits", "store", "up", "again"]]


async def test_a_late_primary_is_marked_down_when_late_for_long() -> None:
    store, primary, _, clock = make("fail-closed")
    primary.mode = "late"
    for rid in ("a", "b", "c", "d"):
        result = await store.admit(req(rid))
        assert result.refused_by == "store_unavailable"
        assert store.primary_up == (rid in "abc")  # c is the third, but a..c came within 100 ms
        clock.now += 0.04
    await store.admit(req("e"))
    assert primary.calls == ["admit a", "admit b", "admit c", "admit d"] and store.failures_total == 4


async def test_an_isolated_late_reply_does_not_mark_the_primary_down() -> None:
    store, primary, _, _ = make()
    for rid in ("a", "b", "c", "d"):  # late, late, answers, late: never three in a row
        primary.mode = "up" if rid == "c" else "late"
        assert (await store.admit(AdmitRequest(rid, T0, 10, budgets=(TPM,)))).admitted
    assert store.primary_up and store.failures_total == 3 and store.degraded_admits_total == 3
    assert primary.calls == ["admit a", "admit b", "admit c", "admit d"]


async def test_a_refused_connection_marks_the_primary_down_at_once() -> None:
    store, primary, _, _ = make()
    primary.mode = "down"
    await store.admit(req("a"))
    assert not store.primary_up


async def test_cleanup_failures_are_counted_not_raised() -> None:
    store, primary, _, _ = make()
    assert (await store.admit(req("a"))).admitted
    primary.mode = "late"
    await store.release(held("a"), T0)
    primary.mode = "down"
    await store.settle(held("a"), 1, T0)
    assert store.failures_total == 2


async def test_close_closes_both() -> None:
    store, primary, _, _ = make()
    await store.close()
    assert primary.calls == ["close"]


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="policy"):
        FailoverStore(MemoryStore(), MemoryStore(), "fail-sideways")  # type: ignore[arg-type]


async def test_fallback_decides_with_this_replicas_share_of_the_limits() -> None:
    primary, fallback = ScriptedStore(), MemoryStore()
    store = FailoverStore(primary, fallback, "fail-open", fallback_share=1 / 3)
    primary.mode = "down"
    tpm = TokenBudget("t:share", 1000, 60)
    first = await store.admit(AdmitRequest("a", T0, 300, budgets=(tpm,)))
    assert first.admitted and first.states[0].limit == 334.0
    assert not (await store.admit(AdmitRequest("b", T0, 40, budgets=(tpm,)))).admitted
    with pytest.raises(ValueError, match="fallback_share"):
        FailoverStore(primary, fallback, "fail-open", fallback_share=0.0)


def test_share_of_rounds_up_and_keeps_keys() -> None:
    request = AdmitRequest("a", T0, 1, rates=(RateLimit("t:r", 10.0, 4.0),), concurrency=(ConcurrencyLimit("t:c", 2),),
                           budgets=(TokenBudget("t:b", 1000, 60),))
    shared = share_of(request, 1 / 3)
    assert shared.rates[0] == RateLimit("t:r", 10.0 * (1 / 3), 2.0)
    assert shared.concurrency[0] == ConcurrencyLimit("t:c", 1)
    assert shared.budgets[0] == TokenBudget("t:b", 334, 60)
    assert share_of(request, 1.0) is request
