"""Hot reload of the policy file: poll, parse into a new immutable `Policy`, hand it over.

A change is any difference in the file's identity as seen through symlinks: inode, device, size,
mtime, ctime, or the resolved path. That covers in-place rewrites, editors' write-and-rename, and
Kubernetes ConfigMap volumes, where `policy.yaml -> ..data/policy.yaml` and the kubelet swaps the
`..data` symlink to a new timestamped directory in one rename (the file's own path never changes,
its target does). A file that fails to parse right after a change may be half written: it is
re-checked after `settle_s` while it keeps changing, and only then reported. A rejected file leaves
the current policy in place (the caller keeps its snapshot); in-flight requests keep whichever
snapshot they started with because the caller swaps one reference.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from extproc.aio import Sleep
from extproc.config.loader import ConfigError, ConfigProblem, load_policy
from extproc.config.schema import Policy
from extproc.periodic import Periodic

__all__ = ["PolicyWatcher"]

log = logging.getLogger(__name__)

Signature = tuple[str, int, int, int, int, int]
_SETTLE_ATTEMPTS = 5


def file_signature(path: Path) -> Signature | None:
    """Identity of the file behind `path` (following every symlink); None if it cannot be read."""
    try:
        info = os.stat(path)
        target = os.path.realpath(path)
    except OSError:
        return None
    return target, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


class PolicyWatcher:
    """Polls `path` every `interval_s`; calls `on_change(policy)` for a new valid policy that differs
    from the current one, `on_error(error)` (file:line problems) for a rejected one, once per change.

    `current` is the policy already in use (so a touched but unchanged file triggers nothing).
    Callbacks run on the event loop; they should only swap references (e.g. `RuntimeHolder.replace`).
    `sleep` (between polls and while a file settles) is injectable: tests run the loop without real time.
    """

    def __init__(self, path: str | Path, on_change: Callable[[Policy], None],
                 on_error: Callable[[ConfigError], None], interval_s: float = 1.0, *,
                 settle_s: float = 0.25, current: Policy | None = None, sleep: Sleep = asyncio.sleep) -> None:
        self.path = Path(path)
        self._on_change = on_change
        self._on_error = on_error
        self._settle_s = settle_s
        self._sleep = sleep
        self.current = current
        self._signature: Signature | None = None
        # A failing callback must not end hot reload: the loop logs it and polls on.
        self._loop = Periodic("policy-watch", self.check, interval_s, log=log, what=f"policy watch of {self.path}",
                              sleep=sleep)
        self.reloads_total = 0
        self.errors_total = 0

    async def start(self) -> None:
        """Remember the file as it is now, then poll in the background."""
        self._signature = await asyncio.to_thread(file_signature, self.path)
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def check(self) -> bool:
        """One poll: True when `on_change` was called."""
        signature = await asyncio.to_thread(file_signature, self.path)
        if signature == self._signature:
            return False
        error: ConfigError | None = None
        for _ in range(_SETTLE_ATTEMPTS):
            self._signature = signature
            try:
                policy = await asyncio.to_thread(self._load, signature)
            except ConfigError as exc:
                error = exc
            else:
                return self._accept(policy)
            await self._sleep(self._settle_s)  # a writer may still be at it
            signature = await asyncio.to_thread(file_signature, self.path)
            if signature == self._signature:
                break
        assert error is not None
        self.errors_total += 1
        log.error("policy file %s rejected, keeping the previous policy:\n%s", self.path, error)
        self._on_error(error)
        return False

    def _load(self, signature: Signature | None) -> Policy:
        if signature is None:
            raise ConfigError([ConfigProblem(str(self.path), 1, "", "cannot read: file missing or unreadable")])
        return load_policy(self.path)

    def _accept(self, policy: Policy) -> bool:
        if policy == self.current:
            return False
        self.current = policy
        self.reloads_total += 1
        log.info("policy file %s reloaded (%d pools)", self.path, len(policy.pools))
        self._on_change(policy)
        return True
