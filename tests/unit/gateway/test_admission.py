from __future__ import annotations

from extproc.config.schema import LimitsConfig, TierConfig, TierLimits
from extproc.gateway.admission import admit_request, rate_limited, ratelimit_headers
from extproc.gateway.usage import UsageReport, decode_reservation, encode_reservation, settlement
from extproc.limits.types import LimitState, Reservation
from extproc.tenants import Tenant

TIER = TierConfig(limits=TierLimits(requests_per_s=5, concurrency=2, tokens_per_min=1000, tokens_per_day=50_000),
                  model_limits=TierLimits(tokens_per_min=400))


def test_admit_request_covers_every_configured_dimension_with_tenant_hash_tag() -> None:
    tenant = Tenant("acme", "default", frozenset())
    request = admit_request(tenant, TIER, "org/m", "r1", 1000.0, 120, LimitsConfig())
    assert request is not None
    assert [r.key for r in request.rates] == ["{acme}:all:rps"]
    assert request.rates[0].burst == 10  # default burst = 2 x rate
    assert [c.key for c in request.concurrency] == ["{acme}:all:cc"]
    assert {(b.key, b.limit, b.window_s) for b in request.budgets} == {
        ("{acme}:all:tpm", 1000, 60), ("{acme}:all:tpd", 50_000, 86_400), ("{acme}:m:org/m:tpm", 400, 60)}
    assert all("{acme}" in k for k in [*(r.key for r in request.rates), *(b.key for b in request.budgets)])


def test_no_limits_no_admission_and_tenant_overrides() -> None:
    assert admit_request(Tenant("a", "default", frozenset()), TierConfig(), "m", "r", 0, 1, LimitsConfig()) is None
    tenant = Tenant("b", "default", frozenset(), limits=TierLimits(tokens_per_min=7))
    request = admit_request(tenant, TIER, "m", "r", 0, 1, LimitsConfig())
    assert request is not None and not request.rates and request.budgets[0].limit == 7


def test_headers_take_the_tightest_state() -> None:
    states = [LimitState("requests", "a", 10, 9, 0.1), LimitState("tokens", "a", 1000, 400, 30),
              LimitState("tokens", "b", 400, 100, 75), LimitState("concurrency", "c", 2, 1, 1)]
    headers = dict(ratelimit_headers(states))
    assert headers == {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
                       "x-ratelimit-reset-requests": "100ms", "x-ratelimit-limit-tokens": "400",
                       "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "1m15s"}


def test_rate_limited_error() -> None:
    error = rate_limited("tokens:lim:{a}:all:tpm", 2.2, [LimitState("tokens", "k", 100, 0, 3)])
    assert error.status == 429 and error.code == "rate_limit_exceeded"
    assert ("retry-after", "3") in error.headers
    assert "tokens per minute" in error.message
    assert rate_limited("store_unavailable", 1, []).status == 503
    assert rate_limited("tokens:k:too-large", 1, []).code == "request_too_large_for_limit"


def test_reservation_round_trip_and_settlement_rules() -> None:
    request = admit_request(Tenant("a", "default", frozenset()), TIER, "m", "r9", 123.456, 300, LimitsConfig())
    assert request is not None
    held = Reservation.of(request)
    encoded = encode_reservation(held)
    decoded = decode_reservation(encoded)
    assert decoded is not None and decoded.tokens == 300 and decoded.budgets == held.budgets
    assert decode_reservation("not json") is None

    def report(status: int, prompt: int | None, completion: int | None) -> UsageReport:
        return UsageReport("r9", status, prompt, completion, encoded, "p", None)

    settled = settlement(report(200, 10, 20))
    assert settled is not None and settled[1] == 30
    assert settlement(report(200, None, None)) is None  # disconnect: the estimate stands
    failed = settlement(report(503, None, None))
    assert failed is not None and failed[1] == 0  # no output was produced
    assert settlement(UsageReport("x", 200, 1, 1, None, None, None)) is None


def test_anthropic_names_mirror_the_openai_headers_with_an_rfc3339_reset() -> None:
    states = [LimitState("requests", "a", 10, 9, 0.1), LimitState("tokens", "b", 400, 100, 75),
              LimitState("tokens-day", "c", 10_000, 50, 3_600)]
    at = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    headers = dict(ratelimit_headers(states, anthropic_at=at))
    assert headers["x-ratelimit-remaining-tokens"] == headers["anthropic-ratelimit-tokens-remaining"] == "50"
    assert headers["anthropic-ratelimit-tokens-limit"] == "10000"
    assert headers["anthropic-ratelimit-tokens-reset"] == "2026-01-01T01:00:00Z"
    assert headers["anthropic-ratelimit-requests-reset"] == "2026-01-01T00:00:01Z"  # rounded up to the second
    assert headers["anthropic-ratelimit-requests-limit"] == "10"
    assert not any(name.startswith("anthropic-") for name in dict(ratelimit_headers(states)))
    error = rate_limited("tokens:lim:{a}:all:tpm", 2.2, states, anthropic_at=at)
    assert dict(error.headers)["anthropic-ratelimit-tokens-remaining"] == "50"
