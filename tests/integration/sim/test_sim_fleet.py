from __future__ import annotations

import socket

import aiohttp
import pytest

from extproc.sim import Fleet, ReplicaSpec, load_profile

pytestmark = pytest.mark.integration


async def test_start_failure_stops_the_replicas_already_listening() -> None:
    profile = load_profile("fast")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        first = ReplicaSpec("m", "127.0.0.1", 0, profile)
        fleet = Fleet([first, ReplicaSpec("m", "127.0.0.1", busy, profile)])
        with pytest.raises(OSError):
            await fleet.start()
        assert not fleet.replicas[0].listening
        port = fleet.replicas[0].port
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_duplicate_addresses_are_rejected() -> None:
    profile = load_profile("fast")
    with pytest.raises(ValueError):
        Fleet([ReplicaSpec("a", "127.0.0.1", 9100, profile), ReplicaSpec("b", "127.0.0.1", 9100, profile)])


async def test_fleet_api_sets_faults_and_echoes_request_ids() -> None:
    profile = load_profile("fast")
    async with Fleet([ReplicaSpec("m", "127.0.0.1", 0, profile) for _ in range(2)]) as fleet, \
            aiohttp.ClientSession() as http:
        await fleet.set_faults({"error_rate": 1.0})
        for replica in fleet.replicas:
            headers = {"x-request-id": "abc123"}
            async with http.post(replica.url + "/v1/completions", json={"prompt": "x"}, headers=headers) as resp:
                assert resp.status == 500
                assert resp.headers["x-request-id"] == "abc123"
                assert resp.headers["x-sim-replica"] == replica.address
                assert (await resp.json())["error"]["type"] == "InternalServerError"
        await fleet.set_faults({"clear": True}, port=fleet.replicas[1].port)
        async with http.post(fleet.replicas[1].url + "/v1/completions", json={"prompt": "x"},
                             headers={"x-request-id": "r-1"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["id"] == "cmpl-r-1"
        assert fleet.endpoints == [{"model": "m", "url": r.url} for r in fleet.replicas]
