"""Stage 1, the request headers: is this a request we serve, who asks, may they, in which priority class.

Everything here is decided before the body arrives, so the cheap refusals (unknown path, bad key, a body
declared too large, a tenant refused by what this process already knows: `TenantGate`) cost no parsing.
"""

from __future__ import annotations

from collections.abc import Callable

from extproc.gateway.admission import has_budgets
from extproc.gateway.auth import Authenticator
from extproc.gateway.priority import priority_class
from extproc.gateway.records import JSON_HEADERS, Caller
from extproc.gateway.runtime import Runtime
from extproc.gateway.tenant_gate import TenantGate
from extproc.gateway.types import RequestHead, Respond
from extproc.openai import api_for_path
from extproc.openai import errors as oai
from extproc.telemetry import GatewayMetrics
from extproc.tenants import Tenant

__all__ = ["Authenticate"]


class Authenticate:
    def __init__(self, authenticator: Authenticator, tenants: TenantGate, metrics: GatewayMetrics,
                 clock: Callable[[], float]) -> None:
        self.authenticator = authenticator
        self._tenants = tenants
        self._metrics = metrics
        self._clock = clock

    def __call__(self, runtime: Runtime, head: RequestHead, request_id: str,
                 tenant: Tenant | None = None) -> Caller | Respond:
        """The caller, or the answer to `GET /v1/models` (what this tenant may use); raises ApiError for a
        refusal. `tenant` (explain only): decide as this tenant without authenticating the request."""
        path = head.path.partition("?")[0]
        api = api_for_path(path)
        models = api is None and path.rstrip("/") == "/v1/models" and head.method == "GET"
        if api is None and not models:
            raise oai.not_found(path)
        if not models and head.method != "POST":
            raise oai.method_not_allowed(head.method, path)
        if not models and head.end_of_stream:
            raise oai.bad_request("Request body is empty", "invalid_json")
        policy = runtime.policy
        who = tenant or self.authenticator.authenticate(head, policy.auth, set(policy.tiers))
        if api is None:  # what this tenant may use, and only to an authenticated caller
            return Respond(200, runtime.models_for(who.models), JSON_HEADERS, details="models")
        limit = policy.bounds.max_body_bytes
        declared = head.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise oai.too_large(limit)
        tier = policy.tiers[who.tier]
        limits = who.limits or tier.limits
        model_limits = who.model_limits or tier.model_limits
        self.refuse_early(who, runtime)
        klass = priority_class(head, tier, policy.flow_control) if policy.flow_control.enabled else ""
        budgeted = has_budgets(limits) or has_budgets(model_limits)
        return Caller(request_id, head, runtime, api, who, tier, klass, budgeted)

    def refuse_early(self, tenant: Tenant, runtime: Runtime) -> None:
        """Refused before the body is parsed (TenantGate: local concurrency, rate retry, parse budget)."""
        policy = runtime.policy
        limits = tenant.limits or policy.tiers[tenant.tier].limits
        refused = self._tenants.refusal(tenant, limits, policy.bounds, self._clock())
        if refused is not None:
            self._metrics.rate_limited.labels(refused[0]).inc()
            raise refused[1]
