from __future__ import annotations

import math
import subprocess
import sys

import pytest

from extproc.rollout import SplitConfig, choose_backend, select_pool, split_weights, stable_bucket, sticky_key
from extproc.rollout.config import Backend, RolloutConfig
from extproc.rollout.split import ordered_pools, override_pool

N = 100_000


def canary_split(**extra: object) -> SplitConfig:
    return SplitConfig.model_validate({
        "model": "chat",
        "backends": [{"pool": "v1", "weight": 95}, {"pool": "v2", "weight": 5}],
        "override_header": "x-canary-pool", "allow_override_tiers": ["internal"], **extra,
    })


def test_bucket_is_stable_uniform_and_not_pythons_hash() -> None:
    assert stable_bucket("chat", "user:42") == stable_bucket("chat", "user:42")
    assert stable_bucket("chat", "user:42") != stable_bucket("other", "user:42")
    # Same value in a fresh interpreter (PYTHONHASHSEED randomises hash() per process).
    code = "from extproc.rollout import stable_bucket; print(repr(stable_bucket('chat', 'user:42')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert float(out) == stable_bucket("chat", "user:42")
    values = [stable_bucket("chat", f"k{i}") for i in range(N)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert abs(sum(values) / N - 0.5) < 0.005


def test_same_key_same_pool() -> None:
    split = canary_split()
    for i in range(1000):
        key = f"user:{i}"
        assert len({choose_backend(split, key) for _ in range(3)}) == 1


@pytest.mark.parametrize("share", [0.05, 0.25, 0.5])
def test_split_accuracy_over_100k_keys(share: float) -> None:
    # Binomial std of the observed share: sqrt(p(1-p)/N) <= 0.16 percentage points at N = 100k;
    # the tolerance of 0.5 pp is > 3 std for every share tested (0.069 pp at 5 %).
    split = canary_split()
    weights = {"v1": 1.0 - share, "v2": share}
    hits = sum(choose_backend(split, f"user:{i}", weights) == "v2" for i in range(N))
    std = math.sqrt(share * (1 - share) / N)
    assert 3 * std < 0.5 / 100
    assert abs(hits / N - share) < 0.005


def test_configured_weights_are_normalised() -> None:
    split = canary_split()
    assert split_weights(split) == pytest.approx({"v1": 0.95, "v2": 0.05})
    hits = sum(choose_backend(split, f"s:{i}") == "v2" for i in range(N))
    assert abs(hits / N - 0.05) < 0.005


def test_canary_users_stay_on_canary_as_its_weight_grows() -> None:
    split = canary_split(rollout={"canary": "v2", "baseline": "v1"})
    keys = [f"user:{i}" for i in range(20_000)]
    previous: set[str] = set()
    for percent in (5, 25, 50, 100):
        weights = split_weights(split, percent)
        on_canary = {k for k in keys if choose_backend(split, k, weights) == "v2"}
        assert previous <= on_canary, f"users left the canary when it grew to {percent}%"
        assert abs(len(on_canary) / len(keys) - percent / 100) < 0.02
        previous = on_canary


def test_other_backends_keep_their_users_while_a_rollout_moves() -> None:
    split = SplitConfig.model_validate({
        "model": "chat",
        "backends": [{"pool": "v1", "weight": 60}, {"pool": "exp", "weight": 20}, {"pool": "v2", "weight": 20}],
        "rollout": {"canary": "v2", "baseline": "v1"},
    })
    assert ordered_pools(split) == ("exp", "v2", "v1")
    keys = [f"u{i}" for i in range(10_000)]
    before = {k for k in keys if choose_backend(split, k, split_weights(split, 5)) == "exp"}
    after = {k for k in keys if choose_backend(split, k, split_weights(split, 50)) == "exp"}
    assert before == after
    weights = split_weights(split, 50)
    assert weights["exp"] == pytest.approx(0.2)
    assert weights["v2"] == pytest.approx(0.4) and weights["v1"] == pytest.approx(0.4)


def test_zero_weights_never_chosen_and_all_zero_rejected() -> None:
    split = canary_split()
    assert all(choose_backend(split, f"k{i}", {"v1": 1.0, "v2": 0.0}) == "v1" for i in range(2000))
    with pytest.raises(ValueError, match="every weight is 0"):
        choose_backend(split, "k", {"v1": 0.0})


def test_sticky_key_fallbacks() -> None:
    by_user = canary_split()
    assert sticky_key(by_user, tenant="t", session="s", user="u", request_id="r") == "user:u"
    assert sticky_key(by_user, tenant="t", session="s", user=None, request_id="r") == "tenant:t"
    assert sticky_key(by_user, tenant=None, session=None, user="", request_id="r") == "request:r"
    by_session = canary_split(sticky_by="session")
    assert sticky_key(by_session, tenant="t", session="s", user="u", request_id="r") == "session:s"
    assert sticky_key(by_session, tenant="t", session=None, user="u", request_id="r") == "user:u"
    by_tenant = canary_split(sticky_by="tenant")
    assert sticky_key(by_tenant, tenant="t", session="s", user="u", request_id="r") == "tenant:t"
    per_request = canary_split(sticky_by="request")
    assert sticky_key(per_request, tenant="t", session="s", user="u", request_id="r") == "request:r"


def test_override_header_only_for_allowed_tiers_and_known_pools() -> None:
    split = canary_split()
    headers = {"x-canary-pool": "v2"}
    assert override_pool(split, headers, "internal") == "v2"
    assert override_pool(split, headers, "default") is None
    assert override_pool(split, {"x-canary-pool": "elsewhere"}, "internal") is None
    assert override_pool(split, {}, "internal") is None
    # A 0-weight canary is reachable by testers.
    chosen = select_pool(split, {"v1": 1.0, "v2": 0.0}, headers=headers, tier="internal", tenant="t",
                         session=None, user="u", request_id="r")
    assert (chosen.pool, chosen.by) == ("v2", "override")
    normal = select_pool(split, {"v1": 1.0, "v2": 0.0}, headers=headers, tier="default", tenant="t",
                         session=None, user="u", request_id="r")
    assert (normal.pool, normal.by, normal.bucket_key) == ("v1", "weight", "user:u")
    no_header = SplitConfig(model="m", backends=(Backend(pool="a", weight=1),), allow_override_tiers=("x",))
    assert override_pool(no_header, {"x-canary-pool": "a"}, "x") is None


def test_rollout_pools_must_be_backends() -> None:
    with pytest.raises(ValueError, match="not one of its backends"):
        SplitConfig(model="m", backends=(Backend(pool="a", weight=1),),
                    rollout=RolloutConfig(canary="b", baseline="a"))
