from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from extproc.config import ConfigError, Policy, load_policy
from extproc.config.watch import PolicyWatcher
from tests.support import SteppedSleep

ONE = """\
pools:
  - name: chat
    model: m/chat
    endpoints: ["127.0.0.1:8001"]
"""
TWO = ONE.replace("8001", "8002")
POLL_S = 1.0
BAD = ONE + "  - name: Bad_Name\n    model: other\n    endpoints: [\"127.0.0.1:9\"]\n"


class Seen:
    def __init__(self) -> None:
        self.policies: list[Policy] = []
        self.errors: list[ConfigError] = []
        self.settles: list[float] = []

    async def sleep(self, delay: float) -> None:
        """The watcher's injected sleep: its poll loop never wakes (these tests call `check` themselves), a
        settle wait returns at once and is recorded."""
        if delay == POLL_S:
            await asyncio.Event().wait()
        self.settles.append(delay)

    def watcher(self, path: Path) -> PolicyWatcher:
        current = load_policy(path) if path.exists() else None
        return PolicyWatcher(path, self.policies.append, self.errors.append, POLL_S, settle_s=0.02,
                             current=current, sleep=self.sleep)

    def endpoints(self) -> list[str]:
        return [p.pools[0].endpoints[0] for p in self.policies]


def replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def started(seen: Seen, path: Path) -> PolicyWatcher:
    watcher = seen.watcher(path)
    await watcher.start()
    return watcher


async def test_rewrite_in_place(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    seen = Seen()
    watcher = await started(seen, path)
    try:
        assert not await watcher.check()
        path.write_text(TWO)
        assert await watcher.check()
        assert seen.endpoints() == ["127.0.0.1:8002"] and seen.errors == []
        assert not await watcher.check()  # reported once
    finally:
        await watcher.stop()


async def test_atomic_rename(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    seen = Seen()
    watcher = await started(seen, path)
    try:
        replace_atomically(path, TWO)
        assert await watcher.check()
        assert seen.endpoints() == ["127.0.0.1:8002"]
    finally:
        await watcher.stop()


def configmap(directory: Path, version: str, text: str) -> None:
    """What the kubelet does: a new timestamped directory, then ..data swapped to it by one rename."""
    (directory / version).mkdir()
    (directory / version / "policy.yaml").write_text(text)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(version)
    os.replace(tmp, directory / "..data")
    link = directory / "policy.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/policy.yaml")


async def test_configmap_data_symlink_swap(tmp_path: Path) -> None:
    configmap(tmp_path, "..2024_01_01_00_00_00.1", ONE)
    path = tmp_path / "policy.yaml"
    seen = Seen()
    watcher = await started(seen, path)
    try:
        configmap(tmp_path, "..2024_01_01_00_01_00.2", TWO)
        assert await watcher.check()
        assert seen.endpoints() == ["127.0.0.1:8002"]
        # Same content under a new directory: the target changed, the policy did not.
        configmap(tmp_path, "..2024_01_01_00_02_00.3", TWO)
        assert not await watcher.check()
        assert len(seen.policies) == 1 and seen.errors == []
    finally:
        await watcher.stop()


async def test_invalid_file_is_reported_with_line_and_old_policy_kept(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    seen = Seen()
    watcher = await started(seen, path)
    try:
        replace_atomically(path, BAD)
        assert not await watcher.check()
        assert seen.policies == [] and len(seen.errors) == 1
        assert any(str(p).startswith(f"{path}:5:") and "pool name" in str(p) for p in seen.errors[0].problems)
        assert watcher.current is not None and watcher.current.pools[0].endpoints == ("127.0.0.1:8001",)
        assert not await watcher.check()  # the same bad file is not reported again
        assert watcher.errors_total == 1
        replace_atomically(path, TWO)
        assert await watcher.check()
        assert seen.endpoints() == ["127.0.0.1:8002"] and watcher.reloads_total == 1
    finally:
        await watcher.stop()


async def test_half_written_file_is_given_time_to_settle(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    seen = Seen()
    watcher = await started(seen, path)
    load = watcher._load
    loads: list[int] = []

    def writer_finishes_after_first_parse(signature: Any) -> Policy:
        loads.append(1)
        try:
            return load(signature)
        finally:
            if len(loads) == 1:
                path.write_text(TWO)  # the writer completes while the watcher waits settle_s

    watcher._load = writer_finishes_after_first_parse  # type: ignore[method-assign]
    try:
        path.write_text(TWO[: len(TWO) // 2])  # caught half written: missing endpoints
        assert await watcher.check()
        assert len(loads) == 2 and seen.settles == [0.02]  # parsed again after settle_s
        assert seen.errors == [] and seen.endpoints() == ["127.0.0.1:8002"]
    finally:
        await watcher.stop()


async def test_missing_file_is_an_error_and_touch_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    seen = Seen()
    watcher = await started(seen, path)
    try:
        os.utime(path, ns=(1, 1))
        assert not await watcher.check()
        assert seen.policies == [] and seen.errors == []
        path.unlink()
        assert not await watcher.check()
        assert "cannot read" in str(seen.errors[0])
    finally:
        await watcher.stop()


async def test_background_polling_and_a_failing_callback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(ONE)
    calls: list[Policy] = []

    def on_change(policy: Policy) -> None:
        calls.append(policy)
        if len(calls) == 1:
            raise RuntimeError("swap failed")

    sleep = SteppedSleep()
    watcher = PolicyWatcher(path, on_change, lambda error: None, interval_s=0.5, current=load_policy(path),
                            sleep=sleep)
    await watcher.start()
    try:
        await sleep.wait_parked()  # polls only after its interval
        assert calls == []
        replace_atomically(path, TWO)
        await sleep.step()  # one poll: sees the change, the callback fails
        assert [p.pools[0].endpoints[0] for p in calls] == ["127.0.0.1:8002"]
        assert f"policy watch of {path} failed" in caplog.text  # and still watching
        replace_atomically(path, ONE)
        await sleep.step()
        assert [p.pools[0].endpoints[0] for p in calls] == ["127.0.0.1:8002", "127.0.0.1:8001"]
        assert sleep.delays == [0.5] * 3
    finally:
        await watcher.stop()
