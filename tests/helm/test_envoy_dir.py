"""envoy/ holds the rendered Envoy configuration: it must match what the renderer and the chart produce now."""

from __future__ import annotations

import subprocess
import sys

from tests.helm.chart import REPO, require_chart


def test_the_committed_envoy_configuration_is_current() -> None:
    chart = require_chart()
    checked = subprocess.run([sys.executable, str(REPO / "envoy" / "generate.py"), "--check", "--helm", chart.helm],
                             capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, f"{checked.stdout}{checked.stderr}"
