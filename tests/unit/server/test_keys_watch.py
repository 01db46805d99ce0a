"""Hot reload of the keys file, one poll at a time (injected sleep): a change swaps the ring, a bad file keeps
the old one, a relative keys file is found next to the policy."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from extproc.config import parse_policy
from extproc.gateway.auth import Authenticator
from extproc.server.keys_watch import KeysWatcher, load_keys
from extproc.tenants import hash_key
from tests.support import SteppedSleep

POOLS = """\
pools:
  - name: chat
    model: m/chat
    endpoints: ["127.0.0.1:8001"]
tiers: {default: {}}
"""
KEYS = """\
tenants:
  - name: %s
    keys: [{sha256: %s}]
"""


def replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def watch_tasks() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == "keys-watch"]


async def test_a_changed_keys_file_is_swapped_in_and_a_bad_one_keeps_the_old_ring(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS % ("acme", hash_key("k1")))
    policy_path = tmp_path / "policy.yaml"
    policy = parse_policy(POOLS + "auth: {mode: api-key, keys_file: keys.yaml, reload_interval_s: 2}\n")
    ring = load_keys(policy, policy_path)  # relative to the policy file's directory
    assert ring is not None and ring.authenticate("k1") is not None
    authenticator = Authenticator(ring)
    sleep = SteppedSleep()
    watcher = KeysWatcher(policy, policy_path, authenticator, sleep=sleep)
    await watcher.start()
    try:
        assert len(watch_tasks()) == 1
        await sleep.step()  # unchanged: nothing reloaded
        assert authenticator.keys is ring and watcher.reloads_total == 0
        replace_atomically(keys, KEYS % ("beta", hash_key("k2")))
        await sleep.step()
        assert authenticator.keys.authenticate("k1") is None
        tenant = authenticator.keys.authenticate("k2")
        assert tenant is not None and tenant.name == "beta" and watcher.reloads_total == 1
        good = authenticator.keys
        with caplog.at_level(logging.ERROR, logger="extproc.server.keys_watch"):
            replace_atomically(keys, KEYS % ("gamma", "not-a-hash"))
            await sleep.step()
            await sleep.step()  # the same bad file is not reported twice
        assert authenticator.keys is good and watcher.errors_total == 1
        assert [r.getMessage().split(",")[0] for r in caplog.records] == [f"keys file {keys} rejected"]
        keys.unlink()  # a missing file is skipped: the ring stays
        await sleep.step()
        assert authenticator.keys is good and watcher.errors_total == 1
        assert sleep.delays == [2.0] * 6
    finally:
        await watcher.stop()


async def test_nothing_is_watched_without_a_keys_file() -> None:
    policy = parse_policy(POOLS + "auth: {mode: trusted-header}\n")
    sleep = SteppedSleep()
    watcher = KeysWatcher(policy, None, Authenticator(), sleep=sleep)
    await watcher.start()
    assert watch_tasks() == [] and load_keys(policy, None) is None
    await watcher.stop()
