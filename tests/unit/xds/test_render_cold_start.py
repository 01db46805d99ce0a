"""A pool that scales from zero holds requests up to its cold_start_timeout_s: Envoy's timers must allow that."""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.config import parse_policy
from extproc.config.loader import ConfigError
from extproc.xds import render_files

POOLS = """\
pools:
  - {name: chat, model: org/chat, endpoints: ["10.0.0.1:8000"], cold_start_timeout_s: %s}
"""


def timers(cold_s: float) -> tuple[str, str]:
    files = render_files(parse_policy(POOLS % cold_s), Path("/cfg"))
    hcm = files["lds.yaml"]["resources"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]
    return ext_proc["max_message_timeout"], hcm["request_timeout"]


def test_envoy_timers_follow_the_longest_cold_start() -> None:
    # Default classes: the longest wait is 30 s (critical); max_message_timeout = wait + 2 s.
    assert timers(0) == ("32s", "61s")
    assert timers(20) == ("32s", "61s")
    # 120 s of cold start: 122 s for the held reply, the request's own timeout = 120 + 1 + 30.
    assert timers(120) == ("122s", "151s")


def test_cold_start_needs_flow_control_and_excludes_a_backup_pool() -> None:
    with pytest.raises(ConfigError, match=r"flow_control\.enabled"):
        parse_policy(POOLS % 10 + "flow_control: {enabled: false}\n")
    with pytest.raises(ConfigError, match=r"scrape\.enabled"):
        parse_policy(POOLS % 10 + "scheduling: {scrape: {enabled: false}}\n")
    two = POOLS % 10 + "  - {name: b, model: b, endpoints: ['10.0.0.2:8000']}\n"
    with pytest.raises(ConfigError, match="exclude each other"):
        parse_policy(two.replace("cold_start_timeout_s: 10", "cold_start_timeout_s: 10, backup_pool: b"))
    with pytest.raises(ConfigError, match="request_timeout_s"):
        parse_policy(POOLS % 100 + "envoy: {request_timeout_s: 90}\n")
