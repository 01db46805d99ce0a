"""Hot reload of the tenants keys file: poll its mtime/size, build a new KeyRing, swap it in."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from extproc.aio import Sleep
from extproc.config import ConfigError, Policy
from extproc.config.watch import Signature, file_signature
from extproc.gateway.auth import Authenticator
from extproc.periodic import Periodic
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
        self._path = _resolve(policy.auth.keys_file, policy_path) if policy.auth.keys_file else None
        self._authenticator = authenticator
        self._loop = Periodic("keys-watch", self.check, policy.auth.reload_interval_s, log=log, sleep=sleep)
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
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def check(self) -> bool:
        """One poll: True when a changed, valid keys file was swapped in."""
        signature = await asyncio.to_thread(self._stat)
        if signature is None or signature == self._signature:
            return False
        self._signature = signature
        try:
            assert self._path is not None
            ring = await asyncio.to_thread(KeyRing.from_file, self._path, set(self._policy.tiers))
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            self.errors_total += 1
            log.error("keys file %s rejected, keeping the previous keys: %s", self._path, exc)
            return False
        self._authenticator.keys = ring
        self.reloads_total += 1
        log.info("keys file %s reloaded: %d active keys", self._path, len(ring))
        return True
