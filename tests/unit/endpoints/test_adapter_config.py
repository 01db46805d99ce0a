"""The policy's rules for adapter upkeep: prewarmed adapters are on-demand ones, and leave room for one more."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, parse_policy


def pool(**options: object) -> str:
    fields = ", ".join(f"{key}: {value}" for key, value in options.items())
    return ("pools: [{name: p, model: m, endpoints: ['127.0.0.1:1'], lora_adapters: [fr, de, pt], "
            f"lora_paths: {{fr: /a/fr, de: /a/de, pt: /a/pt}}, {fields}}}]\n")


def test_defaults_unload_after_half_an_hour_and_prewarm_nothing() -> None:
    (config,) = parse_policy(pool(max_adapters_per_endpoint=4)).pools
    assert (config.lora_idle_unload_s, config.lora_prewarm) == (1800.0, [])


def test_prewarm_names_adapters_loaded_on_demand() -> None:
    with pytest.raises(ConfigError, match="lora_prewarm names adapters not in lora_paths"):
        parse_policy(pool(lora_prewarm="[es]"))


def test_prewarm_leaves_room_for_one_loaded_on_demand() -> None:
    with pytest.raises(ConfigError, match="must leave room"):
        parse_policy(pool(lora_prewarm="[fr, de]", max_adapters_per_endpoint=2))
    (config,) = parse_policy(pool(lora_prewarm="[fr, de]", max_adapters_per_endpoint=3)).pools
    assert config.lora_prewarm == ["fr", "de"]
    (everything,) = parse_policy(pool(lora_prewarm="[fr, de, pt]", max_adapters_per_endpoint=3)).pools
    assert everything.lora_prewarm == ["fr", "de", "pt"]  # nothing left to load on demand: no room needed


def test_a_negative_idle_time_is_refused() -> None:
    with pytest.raises(ConfigError, match="lora_idle_unload_s"):
        parse_policy(pool(lora_idle_unload_s=-1))
