"""Stage 2, the request body: which pool serves the model for this tenant, and the request as the engine will
see it (parsed as vLLM reads it, screened by the content guard, its output bounded), with what it may cost.

The model and the tenant's allow-list are checked right after decoding, before the expensive walk of the
body, so a refused request costs no more than its decoding; every step after that checks the decision's CPU
budget (`bounds.decision_cpu_ms`).
"""

from __future__ import annotations

from collections.abc import Callable

from extproc.config import PoolConfig
from extproc.gateway.calibration import PromptCalibration
from extproc.gateway.records import Caller, Resolved
from extproc.openai import Api, cap_output_tokens, decode_json, parse_document, request_user, requested_model
from extproc.openai import errors as oai
from extproc.openai.apis import SHAPES
from extproc.openai.tokens import estimate_chars
from extproc.rollout.config import SplitConfig
from extproc.rollout.controller import Rollouts
from extproc.rollout.split import select_pool
from extproc.telemetry import GatewayMetrics
from extproc.tenants import ANONYMOUS

__all__ = ["Resolve"]

_TOKENIZER = frozenset({Api.TOKENIZE, Api.DETOKENIZE})


class Resolve:
    def __init__(self, calibration: PromptCalibration, metrics: GatewayMetrics, cpu_clock: Callable[[], float],
                 rollouts: Rollouts | None = None) -> None:
        self.calibration = calibration
        self._metrics = metrics
        self._cpu_clock = cpu_clock  # CPU time of the event loop's thread: what a decision really costs
        self._rollouts = rollouts

    def __call__(self, caller: Caller, body: bytes, cpu_started: float, counting: bool = True) -> Resolved:
        """Raises ApiError for a request that cannot be served. `counting` False (explain): no guard counters."""
        runtime = caller.runtime
        document = decode_json(body, max_bytes=runtime.body_limits.max_bytes)
        if caller.api in _TOKENIZER and "model" not in document and len(runtime.pools) == 1:
            # vLLM's tokenizer takes no model: with one pool there is only one tokenizer to mean (the body
            # reaches the engine as sent); with several, which one is ambiguous and `model` stays required.
            document["model"] = next(iter(runtime.pools.values())).config.model
        pool = self._pool_for(caller, requested_model(document), request_user(caller.api, document))
        request = parse_document(caller.api, document, runtime.body_limits)
        self._within_budget(caller, cpu_started)
        changed = False
        guard = runtime.guard
        if guard is not None and guard.applies_to(caller.tenant.tier):
            masked = guard.apply(request, self._count_guard if counting else None)
            if masked is not None:
                request, changed = masked, True
            self._within_budget(caller, cpu_started)
        limits = runtime.policy.limits
        cap = caller.tier.max_output_tokens
        if cap is None and caller.budgeted and request.max_output_tokens is None:
            cap = limits.default_output_tokens  # the engine may not outrun the reservation
        capped = cap_output_tokens(request, cap) if cap is not None else None
        if capped is not None:
            request, changed = capped, True
        estimate = estimate_chars(len(request.prompt_text) + request.extra_prompt_chars)
        if request.images or request.audios or request.videos:  # media are not text: per-part figures
            estimate += (request.images * pool.image_tokens + request.audios * pool.audio_tokens
                         + request.videos * pool.video_tokens)
        prompt = reserved = estimate
        if limits.calibrate_prompt_tokens:  # the fit for scheduling; its upper bound for reservations
            prompt = self.calibration.tokens(pool.name, estimate)
            reserved = self.calibration.tokens(pool.name, estimate, limits.prompt_reserve_sd)
        output = request.output_tokens
        tokens = reserved + (output if output is not None else limits.default_output_tokens * request.sequences)
        if not SHAPES[request.api].engine_work:  # the tokenizer only: nothing a token budget counts
            tokens = 0
        return Resolved(request, pool, changed, estimate, prompt, tokens)

    def _within_budget(self, caller: Caller, cpu_started: float) -> None:
        budget_ms = caller.runtime.policy.bounds.decision_cpu_ms
        if budget_ms and (self._cpu_clock() - cpu_started) * 1000 > budget_ms:
            raise oai.too_expensive(budget_ms)

    def _count_guard(self, rule: str, action: str, matches: int) -> None:
        self._metrics.guard_matches.labels(rule, action).inc(matches)

    def _pool_for(self, caller: Caller, model: str, user: str | None) -> PoolConfig:
        """The pool serving `model` for this tenant (a split's weighted, sticky choice), or 404."""
        runtime = caller.runtime
        split = runtime.splits.get(model)
        if split is not None and caller.tenant.may_use(model):
            return runtime.pools[self._split_pool(caller, user, split)].config
        found = runtime.by_model.get(model)
        if found is None or not caller.tenant.may_use(model):
            raise oai.model_not_found(model)
        return found.config

    def _split_pool(self, caller: Caller, user: str | None, split: SplitConfig) -> str:
        """Weighted, sticky choice among the split's pools (weights from the shared rollout state)."""
        weights = self._rollouts.current_weights(split.model) if self._rollouts is not None else None
        tenant = caller.tenant
        headers = caller.head.headers
        return select_pool(split, weights, headers=headers, tier=tenant.tier,
                           tenant=None if tenant is ANONYMOUS else tenant.name,
                           session=headers.get("x-session-id"), user=user, request_id=caller.request_id).pool
