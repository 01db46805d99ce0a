from __future__ import annotations

import pytest

from tests.helm.chart import INSTALL_HINT, Chart, find_helm


@pytest.fixture(scope="session")
def chart() -> Chart:
    """The real helm binary is required: a missing one fails the suite instead of skipping it."""
    helm = find_helm()
    if helm is None:
        pytest.fail(f"helm binary not found (.venv/bin/helm or PATH): {INSTALL_HINT}", pytrace=False)
    return Chart(helm)
