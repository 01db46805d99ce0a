"""Hot reload of the tenants keys file: poll its mtime/size, build a new KeyRing, swap it in."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from extproc.aio import Sleep, cancel_and_wait
from extproc.config import ConfigError, Policy
from extproc.config.watch import Signature, file_signature
from extproc.gateway.auth import Authenticator
from extproc.tenants import KeyRing

log = logging.getLogger(__name__)


def load_keys(policy: Policy, base: Path | None) -> KeyRing | None:
    """The key ring for an api-key policy (raises ConfigError); None when keys are not used."""
    if policy.auth.mode != "api-key" or policy.auth.keys_file is None:
        return None
    return KeyRing.from_file(_resolve(policy.auth.keys_file, base), set(policy.tiers))


def _resolve(name: str, base: Path | None) -> Path:
    path = Path(name)
    return path if path.is_absolute() or base is None else base.parent / path


class KeysWatcher:
    """Reloads the keys file when it changes; a bad file is logged and the old ring stays. `sleep` between
    polls is injectable (tests run the loop a round at a time)."""

    def __init__(self, policy: Policy, policy_path: Path | None, authenticator: Authenticator, *,
                 sleep: Sleep = asyncio.sleep) -> None:
        self._policy = policy
        self._sleep = sleep
        self._path = _resolve(policy.auth.keys_file, policy_path) if policy.auth.keys_file else None
        self._authenticator = authenticator
        self._task: asyncio.Task[None] | None = None
        self._signature: Signature | None = None
        self.reloads_total = 0
        self.errors_total = 0

    def _stat(self) -> Signature | None:
        assert self._path is not None
        return file_signature(self._path)  # follows the ..data symlink swap of a Kubernetes Secret volume

    async def start(self) -> None:
        if self._path is None or self._policy.auth.mode != "api-key":
            return
        self._signature = await asyncio.to_thread(self._stat)
        self._task = asyncio.create_task(self._loop(), name="keys-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _loop(self) -> None:
        while True:
            await self._sleep(self._policy.auth.reload_interval_s)
            signature = await asyncio.to_thread(self._stat)
            if signature is None or signature == self._signature:
                continue
            self._signature = signature
            try:
                assert self._path is not None
                ring = await asyncio.to_thread(KeyRing.from_file, self._path, set(self._policy.tiers))
            except (ConfigError, OSError, UnicodeDecodeError) as exc:
                self.errors_total += 1
                log.error("keys file %s rejected, keeping the previous keys: %s", self._path, exc)
                continue
            self._authenticator.keys = ring
            self.reloads_total += 1
            log.info("keys file %s reloaded: %d active keys", self._path, len(ring))
