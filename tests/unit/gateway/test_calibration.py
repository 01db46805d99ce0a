from __future__ import annotations

import random

import pytest

from extproc.gateway.calibration import PromptCalibration


def test_raw_estimate_until_enough_samples_then_the_fitted_line() -> None:
    calibration = PromptCalibration(min_samples=20)
    rng = random.Random(3)
    for _ in range(19):
        estimate = rng.randint(5, 500)
        calibration.observe("chat", estimate, 12 + round(1.3 * estimate))  # template overhead + tokenizer ratio
        assert calibration.tokens("chat", 100) == 100
    calibration.observe("chat", 50, 12 + 65)
    assert calibration.tokens("chat", 100) == 142
    assert calibration.tokens("chat", 10) == 25
    assert calibration.tokens("other", 100) == 100  # per pool
    fit = calibration.describe()["chat"]
    assert fit["observations"] == 20 and fit["slope"] == pytest.approx(1.3, abs=0.01)
    assert fit["intercept"] == pytest.approx(12, abs=0.5)


def test_one_prompt_length_gives_a_ratio_and_nonsense_is_ignored_or_clamped() -> None:
    calibration = PromptCalibration(min_samples=3)
    for _ in range(3):
        calibration.observe("p", 40, 60)
    assert calibration.tokens("p", 40) == 60 and calibration.tokens("p", 80) == 120
    calibration.observe("p", 0, 50)  # no estimate: nothing learned
    calibration.observe("p", 30, 0)
    assert calibration.describe()["p"]["observations"] == 3
    wild = PromptCalibration(min_samples=2)
    wild.observe("p", 10, 1000)
    wild.observe("p", 20, 5000)
    assert wild.describe()["p"]["slope"] == 4.0  # clamped
    assert wild.tokens("p", 0) == 0


def test_recent_traffic_wins_after_a_model_change() -> None:
    calibration = PromptCalibration(half_life=50, min_samples=10)
    for estimate in range(10, 410):
        calibration.observe("p", estimate, estimate)  # ratio 1
    for estimate in range(10, 410):
        calibration.observe("p", estimate, 2 * estimate)  # a new tokenizer: twice the tokens
    assert calibration.tokens("p", 200) == pytest.approx(400, rel=0.02)


def test_replicas_combine_their_sums_into_one_fit() -> None:
    everything, first, second = PromptCalibration(min_samples=10), PromptCalibration(min_samples=10), \
        PromptCalibration(min_samples=10)
    for estimate in range(10, 30):
        for calibration in (everything, first if estimate % 2 else second):
            calibration.observe("chat", estimate, 7 + 2 * estimate)
    assert first.tokens("chat", 100) == 207  # 10 of its own: enough alone
    lonely = PromptCalibration(min_samples=10)  # got no access log entries at all
    assert lonely.tokens("chat", 100) == 100
    lonely.adopt([first.export(), second.export()])
    assert lonely.tokens("chat", 100) == everything.tokens("chat", 100) == 207
    assert lonely.describe()["chat"]["observations"] == 20
    lonely.adopt([{"chat": [1.0, "x"]}, {"other": [0, 0, 0, 0, 0, 0]}])  # malformed or empty: ignored
    assert lonely.tokens("chat", 100) == 100 and lonely.tokens("other", 5) == 5


def test_reservations_use_the_fit_plus_twice_its_recent_relative_error() -> None:
    calibration = PromptCalibration(min_samples=20)
    rng = random.Random(5)
    for _ in range(2000):
        estimate = rng.randint(20, 400)
        calibration.observe("chat", estimate, round(2 * estimate * rng.choice((0.9, 1.1))))  # +-10%
    assert calibration.tokens("chat", 100) == pytest.approx(200, abs=2)
    assert calibration.describe()["chat"]["error_sd"] == pytest.approx(0.1, abs=0.01)
    assert calibration.tokens("chat", 100, margin_sd=2.0) == pytest.approx(240, abs=4)
    exact = PromptCalibration(min_samples=5)
    for estimate in range(10, 40):
        exact.observe("chat", estimate, 3 * estimate)
    assert exact.tokens("chat", 100, margin_sd=2.0) == exact.tokens("chat", 100) == 300  # no error, no margin
    before = PromptCalibration(min_samples=5)  # the combined fit carries the errors; older replicas send 6 sums
    before.adopt([calibration.export(), {"chat": calibration.export()["chat"][:6]}])
    assert before.tokens("chat", 100, margin_sd=2.0) == pytest.approx(240, abs=4)
