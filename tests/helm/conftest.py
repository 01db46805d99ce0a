from __future__ import annotations

import pytest

from tests.helm.chart import Chart, require_chart


@pytest.fixture(scope="session")
def chart() -> Chart:
    return require_chart()
