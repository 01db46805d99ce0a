"""The service as an endpoint picker runs it: TLS on the gRPC port (reloaded when the files change), the gRPC
health services the Inference Extension probes, readiness held until the InferencePool's pods are listed; on both
front ends (service.front_end lean and grpcio)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.bench.stack import free_ports
from extproc.config import Policy
from extproc.server.app import Service, build_service, endpoint_picker_policy
from tests.integration.endpoints.kube_server import KubeApiServer, inference_pool, pod
from tests.support import eventually

pytestmark = pytest.mark.asyncio

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def until(check: Callable[[], object], what: str) -> None:
    await eventually(check, what, timeout_s=10.0)  # a bound for a loaded machine


def write_pair(ca: trustme.CA, directory: Path) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 signed by `ca`, replaced atomically (as a Secret update does)."""
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / "tls.crt", directory / "tls.key"
    chain = b"".join(blob.bytes() for blob in issued.cert_chain_pems)
    for path, blob in ((cert, chain), (key, issued.private_key_pem.bytes())):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    return cert, key


@pytest.fixture(params=["lean", "grpcio"])
def front_end(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def policy(tmp_path: Path, front_end: str, **extra: Any) -> Policy:
    grpc_port, admin_port = free_ports(2)
    return Policy.model_validate({
        "service": {"grpc_port": grpc_port, "admin_port": admin_port, "front_end": front_end,
                    **extra.pop("service", {})},
        "pools": [{"name": "chat", "model": "org/chat", "endpoints": ["127.0.0.1:1"]}], **extra})


@pytest.fixture
async def started() -> AsyncIterator[list[Service]]:
    services: list[Service] = []
    yield services
    for service in services:
        await service.stop(grace_s=0)


async def status(channel: grpc.aio.Channel, name: str) -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name),
                                                               timeout=5)
    return int(response.status)


async def no_sni_handshake(port: int, ca: trustme.CA) -> bool:
    """A TLS client that sends no server name (as Envoy without `sni`) and trusts only `ca`: True if it connects."""
    client = ssl.create_default_context()
    client.check_hostname = False
    ca.configure_trust(client)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="")
    except ssl.SSLError:
        return False
    writer.close()
    return True


async def test_tls_on_the_grpc_port_is_reloaded_when_the_files_change(tmp_path: Path, started: list[Service],
                                                                      front_end: str) -> None:
    first, second = trustme.CA(), trustme.CA()
    cert, key = write_pair(first, tmp_path)
    service = build_service(policy(tmp_path, front_end, service={
        "tls": {"cert_file": str(cert), "key_file": str(key), "reload_interval_s": 0.5}}))
    await service.start()
    started.append(service)
    target = f"127.0.0.1:{service.grpc_port}"

    def trusting(ca: trustme.CA) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca.cert_pem.bytes()))

    async with trusting(first) as channel:
        assert await status(channel, "liveness") == SERVING
    async with grpc.aio.insecure_channel(target) as plaintext:
        with pytest.raises(grpc.aio.AioRpcError):
            await status(plaintext, "liveness")
    write_pair(second, tmp_path)  # rotated: new connections get the new pair
    assert service.tls is not None
    await until(lambda: service.tls is not None and service.tls.reloads_total == 1, "the reload")
    async with trusting(second) as channel:
        assert await status(channel, "readiness") == SERVING
    async with trusting(first) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await status(channel, "liveness")
    assert await no_sni_handshake(service.grpc_port, second) and not await no_sni_handshake(service.grpc_port, first)
    # A key that does not fit the certificate is refused; the current pair stays.
    key.write_bytes(first.issue_cert("127.0.0.1").private_key_pem.bytes())
    await until(lambda: service.tls is not None and service.tls.failures_total >= 1, "the refused pair")
    async with trusting(second) as channel:
        assert await status(channel, "liveness") == SERVING


async def test_health_services_of_the_protocol_and_draining(tmp_path: Path, started: list[Service],
                                                           front_end: str) -> None:
    service = build_service(policy(tmp_path, front_end))
    await service.start()
    started.append(service)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        names = ("liveness", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor", "")

        async def ready() -> bool:
            return await status(channel, "readiness") == SERVING

        await until(ready, "ready")
        assert [await status(channel, name) for name in names] == [SERVING] * 5
        drain = asyncio.create_task(service.stop(grace_s=0, drain_delay_s=30))
        await until(lambda: service.draining, "the drain")

        async def not_ready() -> bool:
            return await status(channel, "readiness") == NOT_SERVING

        await until(not_ready, "readiness NOT_SERVING while draining")
        assert [await status(channel, name) for name in names] == [SERVING] + [NOT_SERVING] * 4
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain


async def test_readiness_waits_for_the_inference_pool_and_its_pods(tmp_path: Path, started: list[Service],
                                                                   front_end: str) -> None:
    kube = KubeApiServer()
    await kube.start()
    try:
        kube.put("inferencepools", inference_pool("llama", {"app": "vllm"}, [8000]))
        kube.put("pods", pod("a", "10.2.0.1", {"app": "vllm"}))
        kube.failures["pods"] = [503] * 1000
        base = policy(tmp_path, front_end)
        source = {"name": "llama", "namespace": "llm", "api_server": kube.url, "backoff_initial_s": 0.05,
                  "backoff_max_s": 0.2}
        picker = endpoint_picker_policy(base, "llm/llama")
        picker = Policy.model_validate({**picker.model_dump(mode="json", exclude_unset=True),
                                        "pools": [{"name": "chat", "model": "org/chat", "inference_pool": source}]})
        service = build_service(picker)
        await service.start()
        started.append(service)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            await until(lambda: kube.count("pods", "list") >= 3, "pod lists refused")
            assert await status(channel, "readiness") == NOT_SERVING
            assert await status(channel, "liveness") == SERVING
            assert not service.ready()
            kube.failures["pods"] = []

            async def serving() -> bool:
                return await status(channel, "inference-extension") == SERVING

            await until(serving, "ready once the pods are listed")
            assert service.ready()
            endpoints = service.runtimes.current.pools["chat"].endpoints
            assert [e.address for e in endpoints] == ["10.2.0.1:8000"]
    finally:
        await kube.stop()


async def test_serve_epp_needs_a_policy_of_one_pool() -> None:
    two = Policy.model_validate({"pools": [{"name": "a", "model": "a", "endpoints": ["10.0.0.1:1"]},
                                           {"name": "b", "model": "b", "endpoints": ["10.0.0.2:1"]}]})
    with pytest.raises(ValueError, match="one pool per process"):
        endpoint_picker_policy(two, None)
    one = endpoint_picker_policy(Policy.model_validate({"pools": [{"name": "a", "model": "a",
                                                                   "endpoints": ["10.0.0.1:1"]}]}), "ns/pool")
    assert one.mode == "endpoint-picker"
    assert one.pools[0].endpoints == () and one.pools[0].inference_pool is not None
    assert (one.pools[0].inference_pool.namespace, one.pools[0].inference_pool.name) == ("ns", "pool")
