"""Tenants and their API keys, from a keys file holding only SHA-256 hashes of the keys.

    tenants:
      - name: acme
        tier: paid              # a tier of the policy; default "default"
        models: [llama-8b]      # models (names or aliases) the tenant may use; empty = all
        limits: {tokens_per_min: 50000}        # optional overrides of the tier's limits
        keys:
          - sha256: 9f86d08...  # `extproc keys hash` prints it for a key
            label: ci           # names the key in the audit log (default: sha256:<first 12 hex digits>)
            revoked: false

A presented key is hashed and looked up; the stored hash is then compared in constant time, so
neither the lookup nor the comparison depends on how much of a guessed key is right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import Field, field_validator

from extproc.config.loader import ConfigError, ConfigProblem, parse_yaml_model
from extproc.limits.config import TierLimits
from extproc.policy_types import Strict

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class KeyEntry(Strict):
    sha256: str
    label: str = ""
    revoked: bool = False

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        value = value.lower()
        if not _HEX64.match(value):
            raise ValueError("sha256 must be 64 hex characters (the SHA-256 of the key, not the key)")
        return value


class TenantEntry(Strict):
    name: str = Field(min_length=1, max_length=128)
    tier: str = "default"
    models: tuple[str, ...] = ()
    limits: TierLimits | None = None
    model_limits: TierLimits | None = None
    keys: tuple[KeyEntry, ...] = ()


class KeysFile(Strict):
    tenants: tuple[TenantEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    tier: str
    models: frozenset[str]  # empty = every model
    limits: TierLimits | None = None
    model_limits: TierLimits | None = None
    # Which key authenticated (for the audit log): its `label`, else "sha256:" + the first 12 hex digits of
    # its hash. Never the key.
    key: str = ""

    def may_use(self, model: str) -> bool:
        return not self.models or model in self.models


ANONYMOUS = Tenant("anonymous", "default", frozenset())


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Immutable lookup from key hash to tenant; a reload builds a new ring."""

    def __init__(self, tenants: dict[str, tuple[str, Tenant]]) -> None:
        self._by_hash = tenants  # hash -> (stored hash, tenant)
        self._by_name = {tenant.name: replace(tenant, key="") for _, tenant in tenants.values()}

    @classmethod
    def from_file(cls, path: str | Path, tiers: set[str]) -> KeyRing:
        text = Path(path).read_text(encoding="utf-8")
        parsed = parse_yaml_model(KeysFile, text, str(path))
        problems: list[ConfigProblem] = []
        by_hash: dict[str, tuple[str, Tenant]] = {}
        names: set[str] = set()
        for tenant in parsed.tenants:
            if tenant.tier not in tiers:
                problems.append(ConfigProblem(str(path), 1, f"tenant {tenant.name}", f"unknown tier {tenant.tier!r}"))
            if tenant.name in names:
                problems.append(ConfigProblem(str(path), 1, f"tenant {tenant.name}", "duplicate tenant name"))
            names.add(tenant.name)
            entry = Tenant(tenant.name, tenant.tier, frozenset(tenant.models), tenant.limits, tenant.model_limits)
            for key in tenant.keys:
                if key.sha256 in by_hash:
                    problems.append(ConfigProblem(str(path), 1, f"tenant {tenant.name}", "key listed twice"))
                if not key.revoked:
                    by_hash[key.sha256] = (key.sha256, replace(entry, key=key.label or f"sha256:{key.sha256[:12]}"))
        if problems:
            raise ConfigError(problems)
        return cls(by_hash)

    def authenticate(self, presented: str) -> Tenant | None:
        digest = hash_key(presented)
        found = self._by_hash.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]

    def tenant(self, name: str) -> Tenant | None:
        """The tenant called `name` (with no key): for the admin API, which decides as a named tenant."""
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_hash)
