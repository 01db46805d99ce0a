"""Redis Cluster key slots: the hash tag rule, checked against redis-py's implementation."""

from __future__ import annotations

import pytest
from redis.crc import key_slot as reference

from extproc.limits.cluster import ClusterClient, hash_tag, key_slot
from extproc.limits.resp import Address


@pytest.mark.parametrize("key", ["lim:{acme}:all:rps:rb", "{acme}", "acme", "lim:{}acme", "{a}{b}", "x{y", "ümlaut{ß}",
                                 "lim:{tenant-42}:m:org/chat-8b:tpm:tw60:28332000"])
def test_key_slots_follow_the_hash_tag_rule(key: str) -> None:
    assert key_slot(key) == key_slot(key.encode()) == reference(key.encode())


def test_keys_of_one_tenant_share_a_slot() -> None:
    assert hash_tag("lim:{acme}:all:tpm:sl") == "acme" and hash_tag("{}x") is None and hash_tag("x}{") is None
    assert len({key_slot(f"lim:{{acme}}:{suffix}") for suffix in ("all:rps:rb", "all:cc:cc", "m:x:tpm:sl")}) == 1


def test_a_cluster_has_only_database_zero() -> None:
    with pytest.raises(ValueError, match="database 0"):
        ClusterClient(Address.from_url("redis://127.0.0.1:7000/3"), timeout_s=1.0)
