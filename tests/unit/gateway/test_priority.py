from __future__ import annotations

import json

import pytest

from extproc.config.schema import TierConfig
from extproc.flow import FlowControlConfig, Rejected
from extproc.gateway.priority import overloaded, priority_class
from extproc.gateway.types import RequestHead
from extproc.openai.errors import ApiError

FLOW = FlowControlConfig()


def head(priority: str | None = None) -> RequestHead:
    headers = {"x-gateway-priority": priority} if priority is not None else {}
    return RequestHead("POST", "/v1/chat/completions", headers)


def test_tier_class_and_default() -> None:
    assert priority_class(head(), TierConfig(), FLOW) == "standard"
    assert priority_class(head(), TierConfig(priority="critical"), FLOW) == "critical"


def test_header_may_lower_always_and_raise_only_to_the_tier_ceiling() -> None:
    assert priority_class(head("sheddable"), TierConfig(), FLOW) == "sheddable"
    assert priority_class(head("critical"), TierConfig(), FLOW) == "standard"
    assert priority_class(head("Critical"), TierConfig(max_priority="critical"), FLOW) == "critical"


def test_unknown_class_is_a_400() -> None:
    with pytest.raises(ApiError) as info:
        priority_class(head("urgent"), TierConfig(), FLOW)
    assert info.value.status == 400 and info.value.code == "invalid_priority"


def test_overloaded_errors_are_openai_shaped_with_retry_after() -> None:
    error = overloaded(Rejected("standard", "timeout", 503, 2.5, 10.0))
    body = json.loads(error.body())
    assert error.status == 503 and body["error"]["code"] == "overloaded_timeout"
    assert dict(error.headers)["retry-after"] == "3"
    assert overloaded(Rejected("free", "saturated", 429, 0.0)).type == "rate_limit_exceeded"
