"""Helpers shared by tests."""

from __future__ import annotations

from extproc.bench.stack import free_ports
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    LimitState,
    RateLimit,
    Reservation,
    TokenBudget,
)
from extproc.xds import find_envoy


def envoy_binary() -> str:
    return find_envoy()


def req(rid: str, at: float, tokens: int = 0, rates: tuple[RateLimit, ...] = (),
        conc: tuple[ConcurrencyLimit, ...] = (), budgets: tuple[TokenBudget, ...] = ()) -> AdmitRequest:
    """A limits admission request, for the store tests."""
    return AdmitRequest(rid, at, tokens, rates=rates, concurrency=conc, budgets=budgets)


def held(request: AdmitRequest) -> Reservation:
    return Reservation.of(request)


def state(result: AdmitResult, name: str) -> LimitState:
    """The state of dimension `name` in an admission result."""
    return next(s for s in result.states if s.name == name)


__all__ = ["envoy_binary", "free_ports", "held", "req", "state"]
