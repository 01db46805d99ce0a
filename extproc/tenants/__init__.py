"""Tenants: API keys (hashed) -> tenant, tier and allowed models."""

from extproc.tenants.keys import ANONYMOUS, KeyRing, Tenant, hash_key

__all__ = ["ANONYMOUS", "KeyRing", "Tenant", "hash_key"]
