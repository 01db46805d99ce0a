"""The rendered configuration passes Envoy's own validation (real envoy binary)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from extproc.config import load_policy
from extproc.xds import write_config
from tests.support import envoy_binary

POLICIES = sorted(Path(__file__).parents[3].joinpath("policies").glob("*.yaml"))


@pytest.mark.parametrize("policy_path", POLICIES, ids=[p.name for p in POLICIES])
def test_rendered_config_passes_envoy_validate(policy_path: Path, tmp_path: Path) -> None:
    write_config(load_policy(policy_path), tmp_path)
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(tmp_path / "static" / "envoy.yaml")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "OK" in result.stdout + result.stderr
