"""Priority classes of requests and the errors of load shedding (flow control's side of the gateway)."""

from __future__ import annotations

import math

from extproc.config.schema import TierConfig
from extproc.flow import FlowControlConfig, Rejected
from extproc.gateway.types import RequestHead
from extproc.openai.errors import ApiError

__all__ = ["overloaded", "priority_class"]


def priority_class(head: RequestHead, tier: TierConfig, config: FlowControlConfig) -> str:
    """The request's class: the priority header if it names a class at most the tier's `max_priority`
    (higher asks are lowered to that ceiling), else the tier's own class. Unknown class -> 400."""
    own = tier.priority or config.default_class
    asked = head.headers.get(config.priority_header)
    if not asked:
        return own
    classes = config.classes
    spec = classes.get(asked.strip().lower())
    if spec is None:
        raise ApiError(400, f"Unknown priority class {asked[:64]!r} in {config.priority_header}; "
                            f"known: {', '.join(sorted(classes))}", "invalid_request_error", "invalid_priority")
    ceiling = tier.max_priority or own
    return asked.strip().lower() if spec.priority <= classes[ceiling].priority else ceiling


def overloaded(rejected: Rejected) -> ApiError:
    """OpenAI-shaped answer for a request flow control could not serve in time."""
    seconds = str(max(1, math.ceil(rejected.retry_after_s)))
    if rejected.reason == "timeout":
        message = f"The model is overloaded: no capacity within {rejected.waited_s:.1f}s; retry later"
    elif rejected.reason == "cold_start":
        message = f"The model is starting: no replica became ready within {rejected.waited_s:.1f}s; retry later"
    elif rejected.reason == "adapter_unavailable":
        message = "The requested adapter could not be loaded in time; retry later"
    elif rejected.reason == "queue_full":
        message = "The model is overloaded and its queue is full; retry later"
    elif rejected.reason == "displaced":
        message = "The model is overloaded: the request gave way to higher-priority traffic; retry later"
    else:
        message = "The model is overloaded; lower-priority requests are shed; retry later"
    kind = "rate_limit_exceeded" if rejected.status == 429 else "server_error"
    return ApiError(rejected.status, message, kind, f"overloaded_{rejected.reason}",
                    headers=(("retry-after", seconds),))
