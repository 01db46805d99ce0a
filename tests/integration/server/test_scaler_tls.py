"""The KEDA scaler on its own port with mTLS (autoscaling.grpc_port + autoscaling.tls), through real gRPC: KEDA's
client certificate gets in; no certificate, one from another CA, or plaintext are refused in the handshake; the
client CA is reloaded when its file changes; the ext_proc port no longer serves the scaler."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
import pytest_asyncio
import trustme

from extproc.bench.stack import free_ports
from extproc.config import Policy
from extproc.server.app import Service, build_service
from tests.keda import client_modules
from tests.support import eventually

pytestmark = pytest.mark.asyncio


def write(path: Path, blob: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)  # atomically, as a Secret update does


class Pki:
    """The server's CA and pair, and the CA that signs KEDA's client certificate (file `client-ca.crt`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server_ca, self.client_ca = trustme.CA(), trustme.CA()
        server = self.server_ca.issue_cert("127.0.0.1")
        self.cert, self.key, self.ca_file = directory / "tls.crt", directory / "tls.key", directory / "client-ca.crt"
        write(self.cert, b"".join(blob.bytes() for blob in server.cert_chain_pems))
        write(self.key, server.private_key_pem.bytes())
        self.trust(self.client_ca)

    def trust(self, ca: trustme.CA) -> None:
        write(self.ca_file, ca.cert_pem.bytes())

    def credentials(self, client_ca: trustme.CA | None) -> grpc.ChannelCredentials:
        """KEDA's side: trusts the server's CA; a client certificate from `client_ca` (None: no certificate)."""
        if client_ca is None:
            return grpc.ssl_channel_credentials(self.server_ca.cert_pem.bytes())
        leaf = client_ca.issue_cert("keda-operator@keda.test")
        return grpc.ssl_channel_credentials(self.server_ca.cert_pem.bytes(), leaf.private_key_pem.bytes(),
                                            b"".join(blob.bytes() for blob in leaf.cert_chain_pems))


@pytest_asyncio.fixture(params=["lean", "grpcio"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Service, Pki]]:
    """The scaler on its own port (grpc.aio, mTLS) beside either front end on the service's port."""
    pki = Pki(tmp_path)
    grpc_port, admin_port, scaler_port = free_ports(3)
    policy = Policy.model_validate({
        "service": {"grpc_port": grpc_port, "admin_port": admin_port, "front_end": request.param},
        "pools": [{"name": "chat", "model": "org/chat", "endpoints": ["127.0.0.1:1"]}],
        "autoscaling": {"enabled": True, "grpc_port": scaler_port, "sample_interval_s": 0.1, "tls": {
            "cert_file": str(pki.cert), "key_file": str(pki.key), "client_ca_file": str(pki.ca_file),
            "reload_interval_s": 0.5}}})
    service = build_service(policy)
    await service.start()
    try:
        yield service, pki
    finally:
        await service.stop(grace_s=0)


@pytest.fixture(scope="module")
def keda(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return client_modules(tmp_path_factory.mktemp("keda-client"))


def ref(pb2: ModuleType) -> Any:
    return pb2.ScaledObjectRef(name="vllm-chat", namespace="ai", scalerMetadata={"pool": "chat"})


async def spec(keda: tuple[ModuleType, ModuleType], channel: grpc.aio.Channel) -> str:
    pb2, grpc_module = keda
    response = await grpc_module.ExternalScalerStub(channel).GetMetricSpec(ref(pb2), timeout=5)
    return str(response.metricSpecs[0].metricName)


def scaler_port(service: Service) -> int:
    assert service.scaler is not None and service.scaler.port is not None
    return service.scaler.port.port


async def test_keda_with_its_client_certificate_gets_in(served: tuple[Service, Pki],
                                                        keda: tuple[ModuleType, ModuleType]) -> None:
    service, pki = served
    target = f"127.0.0.1:{scaler_port(service)}"
    async with grpc.aio.secure_channel(target, pki.credentials(pki.client_ca)) as channel:
        assert await spec(keda, channel) == "extproc-demand-chat"
        pb2, grpc_module = keda
        assert (await grpc_module.ExternalScalerStub(channel).IsActive(ref(pb2), timeout=5)).result is False


@pytest.mark.parametrize("attacker", ["no certificate", "another CA's certificate", "plaintext"])
async def test_a_client_without_keda_s_certificate_is_refused(served: tuple[Service, Pki],
                                                              keda: tuple[ModuleType, ModuleType],
                                                              attacker: str) -> None:
    service, pki = served
    target = f"127.0.0.1:{scaler_port(service)}"
    channels: dict[str, Callable[[], grpc.aio.Channel]] = {
        "no certificate": lambda: grpc.aio.secure_channel(target, pki.credentials(None)),
        "another CA's certificate": lambda: grpc.aio.secure_channel(target, pki.credentials(trustme.CA())),
        "plaintext": lambda: grpc.aio.insecure_channel(target),
    }
    async with channels[attacker]() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await spec(keda, channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed: no call was served


async def test_the_ext_proc_port_does_not_serve_the_scaler(served: tuple[Service, Pki],
                                                           keda: tuple[ModuleType, ModuleType]) -> None:
    service, _ = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await spec(keda, channel)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_rotated_client_ca_lets_the_new_certificate_in_and_the_old_one_not(
        served: tuple[Service, Pki], keda: tuple[ModuleType, ModuleType]) -> None:
    service, pki = served
    target = f"127.0.0.1:{scaler_port(service)}"
    old, new = pki.client_ca, trustme.CA()
    pki.trust(new)
    tls = service.scaler.port.tls if service.scaler is not None and service.scaler.port is not None else None
    assert tls is not None
    await eventually(lambda: tls.reloads_total == 1, "the client CA reloaded", timeout_s=10)
    async with grpc.aio.secure_channel(target, pki.credentials(new)) as channel:
        assert await spec(keda, channel) == "extproc-demand-chat"
    async with grpc.aio.secure_channel(target, pki.credentials(old)) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await spec(keda, channel)


async def test_the_metric_spec_is_pushed_again_when_a_reload_changes_the_target(
        served: tuple[Service, Pki], keda: tuple[ModuleType, ModuleType]) -> None:
    service, pki = served
    pb2, grpc_module = keda
    async with grpc.aio.secure_channel(f"127.0.0.1:{scaler_port(service)}", pki.credentials(pki.client_ca)) as channel:
        stub = grpc_module.ExternalScalerStub(channel)
        stream = stub.StreamMetricSpec(ref(pb2))
        first = await stream.read()
        assert [(m.metricName, m.targetSizeFloat) for m in first.metricSpecs] == [("extproc-demand-chat", 8.0)]
        policy = service.runtimes.current.policy
        pools = [policy.pools[0].model_copy(update={"target_per_replica": 3.0})]
        service.runtimes.replace(policy.model_copy(update={"pools": pools}))
        second = await asyncio.wait_for(stream.read(), 10)
        assert [(m.metricName, m.targetSizeFloat) for m in second.metricSpecs] == [("extproc-demand-chat", 3.0)]
        assert (await stub.GetMetricSpec(ref(pb2), timeout=5)).metricSpecs[0].targetSizeFloat == 3.0
        stream.cancel()
