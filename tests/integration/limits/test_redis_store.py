"""RedisStore specifics: key TTLs, script reload, hash tags, clamping, errors, AUTH and TLS."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from extproc.limits import (
    AdmitRequest,
    ConcurrencyLimit,
    RateLimit,
    RedisStore,
    Reservation,
    StoreUnavailable,
    TokenBudget,
    hash_tag,
)
from extproc.limits.redis_address import RedisTls
from tests.integration.limits.conftest import redis_store
from tests.integration.limits.redis_server import RedisServer
from tests.support import free_ports

pytestmark = pytest.mark.integration

T0 = 1_699_920_000.0
RPS = RateLimit("{t}:rps", rate=10.0, burst=20.0)
CC = ConcurrencyLimit("{t}:cc", limit=4, lease_ttl_s=30.0)
TPM = TokenBudget("{t}:tpm", limit=1000, window_s=60)
TPD = TokenBudget("{t}:tpd", limit=10_000, window_s=86400)


def full(rid: str, at: float, tokens: int) -> AdmitRequest:
    return AdmitRequest(rid, at, tokens, rates=(RPS,), concurrency=(CC,), budgets=(TPM, TPD))


async def test_every_key_expires(redis_server: RedisServer) -> None:
    store = redis_store(redis_server, prefix="ttl:")
    raw = Redis.from_url(redis_server.url)
    try:
        assert (await store.admit(full("r1", T0 + 30, 10))).admitted
        ttls = {key.decode() if isinstance(key, bytes) else key: await raw.pttl(key) for key in await raw.keys("ttl:*")}
        assert ttls.keys() == {"ttl:{t}:rps:rb", "ttl:{t}:cc:cc", f"ttl:{{t}}:tpm:tw60:{int(T0) // 60}",
                               f"ttl:{{t}}:tpd:tw86400:{int(T0) // 86400}", "ttl:{t}:tpm:res:r1"}
        assert 3000 < ttls["ttl:{t}:rps:rb"] <= 4000  # 2 x burst / rate
        assert 29_000 < ttls["ttl:{t}:cc:cc"] <= 30_000
        assert 90_000 < ttls[f"ttl:{{t}}:tpm:tw60:{int(T0) // 60}"] <= 91_000  # to the end of the next window
        assert 2 * 86400_000 - 31_000 < ttls["ttl:{t}:tpm:res:r1"] <= 2 * 86400_000  # as long as the day window
        await store.settle(Reservation("r1", 10, (CC,), (TPM, TPD), T0 + 30), 5, T0 + 31)
        await store.ping()  # settle is posted: wait until Redis has run it
        assert not await raw.exists("ttl:{t}:tpm:res:r1")
        assert await raw.pttl(f"ttl:{{t}}:tpm:tw60:{int(T0) // 60}") > 89_000  # settle keeps the TTL
    finally:
        await store.close()
        await raw.aclose()


async def test_script_is_reloaded_after_script_flush(redis_server: RedisServer) -> None:
    store = redis_store(redis_server)
    raw = Redis.from_url(redis_server.url)
    try:
        assert (await store.admit(full("a", T0, 1))).admitted
        await raw.script_flush()
        assert (await store.admit(full("b", T0, 1))).admitted
    finally:
        await store.close()
        await raw.aclose()


async def test_settle_never_drives_a_window_below_zero(redis_server: RedisServer) -> None:
    store = redis_store(redis_server, prefix="clamp:")
    raw = Redis.from_url(redis_server.url)
    try:
        a = AdmitRequest("a", T0 + 5, 50, budgets=(TPM,))
        assert (await store.admit(a)).admitted
        window = f"clamp:{{t}}:tpm:tw60:{int(T0) // 60}"
        await raw.set(window, 10)  # e.g. the counter was lost and rebuilt lower
        await store.settle(Reservation("a", 50, (), (TPM,), T0 + 5), 0, T0 + 6)
        await store.ping()
        assert await raw.get(window) == b"0"
    finally:
        await store.close()
        await raw.aclose()


async def test_a_failed_posted_call_is_reported(redis_server: RedisServer) -> None:
    store = redis_store(redis_server, prefix="posted:")
    raw = Redis.from_url(redis_server.url)
    failed: list[tuple[str, str]] = []
    store.on_posted_failure = lambda op, reason: failed.append((op, reason))
    try:
        await raw.set("posted:{t}:cc:cc", "not a sorted set")
        await store.release(Reservation("a", 1, (CC,), (), T0), T0)
        await store.ping()
        assert store.posted_failures == {"release": 1} and failed[0][0] == "release" and "WRONGTYPE" in failed[0][1]
    finally:
        await store.close()
        await raw.aclose()


def test_hash_tags() -> None:
    assert hash_tag("{acme}:gpt") == "acme"
    assert hash_tag("lim:{acme}:gpt:tw60:1") == "acme"
    assert hash_tag("acme") is None
    assert hash_tag("{}acme") is None
    with pytest.raises(ValueError):
        RedisStore("redis://127.0.0.1:1", prefix="{x}:")


async def test_require_hash_tag_rejects_keys_of_different_slots(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, require_hash_tag=True, prefix="tag:")
    try:
        assert (await store.admit(full("a", T0, 1))).admitted
        mixed = AdmitRequest("b", T0, 1, budgets=(TPM, TokenBudget("other:tpd", 10, 86400)))
        with pytest.raises(ValueError, match="hash tag"):
            await store.admit(mixed)
    finally:
        await store.close()


async def test_unreachable_redis_raises_store_unavailable(servers: Callable[..., RedisServer]) -> None:
    server = servers()
    store = RedisStore(server.url, timeout_ms=200)
    try:
        assert (await store.admit(full("a", T0, 1))).admitted
        server.kill()
        for call in (store.admit(full("b", T0, 1)), store.release(Reservation("a", 1, (CC,), (), T0), T0),
                     store.settle(Reservation("a", 1, (), (TPM,), T0), 0, T0)):
            with pytest.raises(StoreUnavailable):
                await call
    finally:
        await store.close()


async def test_auth(servers: Callable[..., RedisServer]) -> None:
    server = servers("--requirepass", "s3cret")
    good = RedisStore(f"redis://:s3cret@127.0.0.1:{server.port}", timeout_ms=2000)
    user = RedisStore(f"redis://default:s3cret@127.0.0.1:{server.port}", timeout_ms=2000)
    bad = RedisStore(f"redis://:wrong@127.0.0.1:{server.port}", timeout_ms=2000)
    none = RedisStore(f"redis://127.0.0.1:{server.port}", timeout_ms=2000)
    try:
        assert (await good.admit(full("a", T0, 1))).admitted
        assert (await user.admit(full("b", T0, 1))).admitted
        for store in (bad, none):
            with pytest.raises(StoreUnavailable):
                await store.admit(full("c", T0, 1))
    finally:
        for store in (good, user, bad, none):
            await store.close()


def _certificates(where: Path) -> tuple[Path, Path, Path]:
    ca_key, ca, key, csr, cert = (where / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    ext = where / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1",
         "-subj", "/CN=test-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
         "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    return ca, cert, key


async def test_tls_and_auth(servers: Callable[..., RedisServer], tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    tls_port = free_ports(1)[0]
    server = servers("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                     "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--requirepass", "s3cret",
                     tls_port=tls_port)
    assert server.tls_port == tls_port
    secure = RedisStore(f"rediss://:s3cret@127.0.0.1:{tls_port}", timeout_ms=2000, tls=RedisTls(ca_file=str(ca)))
    untrusted = RedisStore(f"rediss://:s3cret@127.0.0.1:{tls_port}", timeout_ms=2000)
    try:
        assert (await secure.admit(full("a", T0, 1))).admitted
        with pytest.raises(StoreUnavailable):  # the server's certificate is not signed by a system CA
            await untrusted.admit(full("b", T0, 1))
    finally:
        await secure.close()
        await untrusted.close()


async def test_warm_up_loads_scripts_and_fails_clearly(redis_server: RedisServer,
                                                       servers: Callable[..., RedisServer]) -> None:
    store = redis_store(redis_server)
    raw = Redis.from_url(redis_server.url)
    try:
        await raw.script_flush()
        await store.warm_up()
        assert await raw.script_exists(*(s.sha for s in RedisStore.SCRIPTS)) == [True] * len(RedisStore.SCRIPTS)
        assert (await store.admit(AdmitRequest("none", T0, 5))).admitted  # no limits: no round trip needed
    finally:
        await store.close()
        await raw.aclose()
    gone = servers()
    gone.kill()
    unreachable = RedisStore(gone.url)
    try:
        with pytest.raises(StoreUnavailable):
            await unreachable.warm_up()
    finally:
        await unreachable.close()
