from __future__ import annotations

import pytest
from pydantic import ValidationError

from extproc.config import parse_policy
from extproc.flow import FlowControlConfig

POOLS = "pools: [{name: chat, model: m, endpoints: ['127.0.0.1:8000']}]\n"


def test_defaults_have_three_classes_and_a_bounded_queue() -> None:
    config = FlowControlConfig()
    assert set(config.classes) == {"critical", "standard", "sheddable"}
    # Sheddable waits a moment, never past a second, and keeps no more for the classes above it than standard does.
    assert config.classes["sheddable"].max_wait_s == 1.0
    assert config.classes["sheddable"].reserve == config.classes["standard"].reserve
    assert config.longest_wait_s() == 30.0


def test_default_class_must_exist() -> None:
    with pytest.raises(ValidationError, match="default_class"):
        FlowControlConfig.model_validate({"classes": {"gold": {"priority": 1}}})


def test_tier_naming_an_unknown_class_fails_with_its_line() -> None:
    text = POOLS + "tiers:\n  default: {}\n  paid:\n    priority: platinum\n"
    with pytest.raises(Exception, match="platinum") as info:
        parse_policy(text, "policy.yaml")
    assert "policy.yaml" in str(info.value)
