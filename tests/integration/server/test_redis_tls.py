"""Every Redis connection of the service over TLS, against a real redis-server that speaks only TLS (its plain port
is off) and requires client certificates: the limits store, the fleet and calibration exchanges and the rollout
store, each built from the policy exactly as `extproc serve` builds them (`extproc.server.stores`). A client that
presents no certificate, or one signed by a CA the server does not trust, is refused; so is a server whose
certificate the policy's settings do not trust."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml

from extproc.config import Policy, parse_policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway.calibration import PromptCalibration
from extproc.limits import AdmitRequest, StoreUnavailable, TokenBudget
from extproc.rollout import RolloutState, RolloutStoreUnavailable
from extproc.server.stores import (
    REDIS_URL_ENV,
    build_calibration_sync,
    build_fleet_sync,
    build_rollout_store,
    build_store,
)
from tests.certs import Certs, make_certs
from tests.integration.limits.redis_server import RedisServer
from tests.support import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_port(certs: Certs) -> Iterator[int]:
    port = free_ports(1)[0]
    server = RedisServer("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs.server_cert),
                         "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca),
                         "--tls-auth-clients", "yes", tls_port=port).start()
    try:
        yield port
    finally:
        server.kill()


@pytest.fixture(autouse=True)
def no_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)


def policy(port: int, tls: dict[str, str]) -> Policy:
    doc: dict[str, Any] = {
        "pools": [{"name": "chat", "model": "m", "endpoints": ["127.0.0.1:9"]}],
        "limits": {"store": "redis", "redis_url": f"rediss://127.0.0.1:{port}", "redis_tls": tls,
                   "decision_deadline_ms": 1000},
        "flow_control": {"fleet_sync_ms": 1000},  # each exchange may take a second (a loaded test machine)
    }
    return parse_policy(yaml.safe_dump(doc), "policy.yaml")


class Connections:
    """The four things a service keeps in Redis, built from one policy; closed at the end."""

    def __init__(self, built: Policy) -> None:
        self.store, redis = build_store(built)
        assert redis is not None
        self.redis = redis
        fleet = build_fleet_sync(built, EndpointRegistry(), lambda: None)
        calibration = build_calibration_sync(built, PromptCalibration())
        assert fleet is not None and calibration is not None
        self.fleet, self.calibration = fleet, calibration
        self.rollouts = build_rollout_store(built)

    async def close(self) -> None:
        await self.store.close()
        await self.fleet.stop()
        await self.calibration.stop()
        await self.rollouts.close()


@pytest.fixture
async def connect() -> AsyncIterator[Any]:
    made: list[Connections] = []

    def build(built: Policy) -> Connections:
        made.append(Connections(built))
        return made[-1]

    yield build
    for connections in made:
        await connections.close()


def trusted(certs: Certs, **more: str) -> dict[str, str]:
    return {"ca_file": str(certs.ca), "cert_file": str(certs.client_cert), "key_file": str(certs.client_key), **more}


async def test_every_redis_connection_of_the_service_speaks_tls(tls_port: int, certs: Certs, connect: Any) -> None:
    redis = connect(policy(tls_port, trusted(certs)))
    await redis.redis.warm_up()
    budget = TokenBudget("{tls}:tpm", 100, 60)
    assert (await redis.redis.admit(AdmitRequest("r1", 1_700_000_000.0, 60, budgets=(budget,)))).admitted
    refused = await redis.redis.admit(AdmitRequest("r2", 1_700_000_000.0, 60, budgets=(budget,)))
    assert not refused.admitted  # decided by Redis, which counted the first request
    await redis.fleet.sync_once()
    assert redis.fleet.syncs_total == 1
    assert await redis.calibration.sync_once() == 0  # no other replica yet
    state = RolloutState("m", "v2", "v1", 0, 5.0, "running", "started", 1.0, 1.0, 1, 1)
    assert await redis.rollouts.save(state, 0)
    assert await redis.rollouts.load("m") == state
    # A second replica, from the same policy, sees the first one's work.
    other = connect(policy(tls_port, trusted(certs)))
    await other.fleet.sync_once()
    assert other.fleet.replicas == 2 and await other.calibration.sync_once() == 1
    assert await other.rollouts.load("m") == state


async def expect_refused(redis: Connections, reason: str) -> None:
    """Every connection fails; the first one for `reason` (the TLS alert or verification error)."""
    with pytest.raises(StoreUnavailable, match=reason):
        await redis.redis.warm_up()
    with pytest.raises(StoreUnavailable):
        await redis.fleet.sync_once()
    with pytest.raises(StoreUnavailable):
        await redis.calibration.sync_once()
    with pytest.raises(RolloutStoreUnavailable):
        await redis.rollouts.load("m")


# The server's alert (certificate required, unknown ca) or, when it closes first, a reset: refused either way,
# where the same client with the trusted certificate is served (test_every_redis_connection_of_the_service...).
REFUSED_BY_THE_SERVER = "certificate required|unknown ca|reset by peer|closed by the server"


@pytest.mark.parametrize(("client", "reason"), [
    ("no certificate", REFUSED_BY_THE_SERVER),
    ("untrusted certificate", REFUSED_BY_THE_SERVER),  # signed by another CA
])
async def test_a_client_without_a_certificate_the_server_trusts_is_refused(
        tls_port: int, certs: Certs, connect: Any, client: str, reason: str) -> None:
    tls = {"ca_file": str(certs.ca)}
    if client == "untrusted certificate":
        tls |= {"cert_file": str(certs.rogue_client_cert), "key_file": str(certs.rogue_client_key)}
    await expect_refused(connect(policy(tls_port, tls)), reason)


@pytest.mark.parametrize(("settings", "refused_for"), [
    ({}, None),  # the certificate names 127.0.0.1, the address connected to
    ({"server_name": "redis.test"}, None),  # and redis.test
    ({"server_name": "other.test"}, "not valid for 'other.test'"),  # not this name
    ({"server_name": "other.test", "verify": "ca"}, None),  # the name is not checked, the CA still is
    ({"ca_file": None}, "self-signed certificate in certificate chain"),  # the system's CAs do not sign it
])
async def test_the_server_certificate_is_checked_as_configured(
        tls_port: int, certs: Certs, connect: Any, settings: dict[str, str | None], refused_for: str | None) -> None:
    tls = {key: value for key, value in (trusted(certs) | settings).items() if value is not None}
    redis = connect(policy(tls_port, tls))
    if refused_for is not None:
        await expect_refused(redis, refused_for)
        return
    await redis.redis.warm_up()
    await redis.fleet.sync_once()
    assert await redis.rollouts.load("absent") is None
