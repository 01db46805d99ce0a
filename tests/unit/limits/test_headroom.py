"""Headroom: when an admission may go on without waiting for the shared store (deterministic, no I/O)."""

from __future__ import annotations

import pytest

from extproc.limits import AdmitRequest, ConcurrencyLimit, RateLimit, Reservation, TokenBudget
from extproc.limits.headroom import Headroom
from extproc.limits.types import LimitState

NOW = 1_699_920_000.0  # a minute boundary (divisible by 60)
TPM = TokenBudget("t:tpm", limit=1000, window_s=60)
CONC = ConcurrencyLimit("t:conc", limit=4)
RPS = RateLimit("t:rps", rate=10.0, burst=10.0)


def req(rid: str, tokens: int = 100, now: float = NOW + 1, budgets: tuple[TokenBudget, ...] = (TPM,),
        concurrency: tuple[ConcurrencyLimit, ...] = (), rates: tuple[RateLimit, ...] = ()) -> AdmitRequest:
    return AdmitRequest(rid, now, tokens, rates=rates, concurrency=concurrency, budgets=budgets)


def tokens_left(remaining: float, budget: TokenBudget = TPM) -> tuple[LimitState, ...]:
    return (LimitState("tokens", budget.key, float(budget.limit), remaining, 59.0),)


def reported(headroom: Headroom, remaining: float, now: float = NOW + 1) -> None:
    """The store answered an awaited admission with `remaining` tokens left."""
    request = req("report", now=now)
    seq, result = headroom.take(request)
    assert result is None or headroom.optimistic_total  # first contact always waits
    headroom.replied(request, seq, tokens_left(remaining))


def test_waits_for_the_store_until_it_has_a_report_then_admits_without_waiting() -> None:
    headroom = Headroom()
    seq, result = headroom.take(req("a"))
    assert result is None and headroom.awaited_total == 1
    headroom.replied(req("a"), seq, tokens_left(900))
    seq, result = headroom.take(req("b", tokens=200))
    assert result is not None and result.admitted and headroom.optimistic_total == 1
    # the estimated state for the headers: report minus this request
    assert [(s.name, s.limit, s.remaining) for s in result.states] == [("tokens", 1000.0, 700.0)]
    assert result.states[0].reset_s == pytest.approx(59.0)


def test_in_flight_admissions_count_until_their_reply_and_the_share_bounds_them() -> None:
    headroom = Headroom(share=0.5)
    reported(headroom, 1000)
    assert headroom.take(req("a", tokens=300))[1] is not None  # 0 + 300 <= 500
    seq_b, result = headroom.take(req("b", tokens=300))  # 300 + 300 > 500: wait for the store
    assert result is None
    # b is in flight too (as if admitted) until its reply: even a small request now waits
    assert headroom.take(req("c", tokens=1))[1] is None
    headroom.replied(req("b", tokens=300), seq_b, None)  # b failed: nothing learned, no longer in flight
    # a (300) and c (1) still in flight: 301 + 199 <= 500
    assert headroom.take(req("d", tokens=199))[1] is not None


def test_a_reply_sent_earlier_never_replaces_a_newer_report() -> None:
    headroom = Headroom()
    reported(headroom, 1000)
    old_seq, _ = headroom.take(req("old", tokens=10))
    new_seq, _ = headroom.take(req("new", tokens=10))
    headroom.replied(req("new", tokens=10), new_seq, tokens_left(100))
    headroom.replied(req("old", tokens=10), old_seq, tokens_left(990))  # arrives late: stale
    seq, result = headroom.take(req("x", tokens=101))
    assert result is None
    headroom.replied(req("x", tokens=101), seq, None)
    result = headroom.take(req("y", tokens=100))[1]
    assert result is not None and result.states[0].remaining == 0.0


def test_an_old_report_or_another_window_is_not_trusted() -> None:
    headroom = Headroom(max_age_s=0.5)
    reported(headroom, 1000, now=NOW + 1)
    assert headroom.take(req("fresh", now=NOW + 1.4))[1] is not None
    assert headroom.take(req("old", now=NOW + 1.6))[1] is None
    headroom = Headroom(max_age_s=5)
    reported(headroom, 1000, now=NOW + 59.9)
    assert headroom.take(req("next-window", now=NOW + 60.1))[1] is None


def test_every_dimension_must_fit() -> None:
    headroom = Headroom()
    request = req("a", tokens=10, concurrency=(CONC,), rates=(RPS,))
    seq, _ = headroom.take(request)
    headroom.replied(request, seq, (LimitState("requests", RPS.key, 10.0, 5.0, 0.5),
                                    LimitState("concurrency", CONC.key, 4.0, 1.0, 0.0),
                                    *tokens_left(900)))
    result = headroom.take(req("b", tokens=10, concurrency=(CONC,), rates=(RPS,)))[1]
    assert result is not None
    assert [(s.name, s.remaining) for s in result.states] == [("requests", 4.0), ("concurrency", 0.0),
                                                            ("tokens", 890.0)]
    assert result.states[0].reset_s == pytest.approx(0.6)  # 6 requests to refill at 10/s
    # the only lease left is in flight now: the next one waits for the store
    assert headroom.take(req("c", tokens=10, concurrency=(CONC,), rates=(RPS,)))[1] is None


def test_releases_and_settles_credit_the_report() -> None:
    headroom = Headroom()
    request = req("a", tokens=300, concurrency=(CONC,))
    seq, _ = headroom.take(request)
    headroom.replied(request, seq, (LimitState("concurrency", CONC.key, 4.0, 0.0, 1.0), *tokens_left(100)))
    assert headroom.take(req("b", tokens=1, concurrency=(CONC,)))[1] is None  # no lease left
    headroom.replied(req("b", tokens=1, concurrency=(CONC,)), seq + 1, None)
    reservation = Reservation("a", 300, (CONC,), (TPM,), NOW + 1)
    headroom.released(reservation)
    headroom.settled(reservation, 20)  # used 20 of the 300 reserved: 280 back
    result = headroom.take(req("c", tokens=380, concurrency=(CONC,)))[1]
    assert result is not None and [s.remaining for s in result.states] == [0.0, 0.0]
    # a settle of a reservation charged to an earlier window does not touch this window's report
    headroom.settled(Reservation("z", 500, (), (TPM,), NOW - 30), 0)
    assert headroom.take(req("d", tokens=1))[1] is None


def test_overshoots_are_counted_and_idle_keys_forgotten() -> None:
    headroom = Headroom(max_age_s=1)
    reported(headroom, 1000)
    seq, _ = headroom.take(req("a"))
    headroom.replied(req("a"), seq, tokens_left(0), overshoot=True)
    assert headroom.overshoots_total == 1
    assert len(headroom) == 1
    headroom.take(req("later", now=NOW + 30, budgets=(TokenBudget("u:tpm", 10, 60),)))  # sweeps
    assert len(headroom) == 1  # t:tpm forgotten, u:tpm in flight


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="share"):
        Headroom(share=0)
    with pytest.raises(ValueError, match="max_age_s"):
        Headroom(max_age_s=0)
