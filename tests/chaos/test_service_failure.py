"""Our own service killed under load: fail-closed answers 500, fail-open serves the fallback pool.

In neither mode can a client pick a pool or endpoint by sending our routing headers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from extproc.bench.loadgen import RequestSpec, Sample, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, launch, start_service

pytestmark = pytest.mark.asyncio

MAIN = SimPool("main", "org/main", 2, aliases=("main",))
SPARE = SimPool("spare", "org/spare", 1, aliases=("spare",))


def spec_for(stack: Stack) -> object:
    spare_endpoint = f"127.0.0.1:{stack.sim_ports['spare'][0]}"

    def spec(index: int) -> RequestSpec:
        # The served name: while bypassed nobody rewrites aliases (list them in vLLM --served-model-name).
        body = {"model": "org/main", "messages": [{"role": "user", "content": f"q{index}"}], "max_tokens": 4}
        # Every request also tries to steer itself by header: it must never work.
        headers = (("content-type", "application/json"), ("x-gateway-pool", "spare"),
                   ("x-gateway-destination-endpoint", spare_endpoint))
        return RequestSpec("POST", "/v1/chat/completions", headers, json.dumps(body).encode())

    return spec


async def kill_and_restart(group: ProcessGroup, stack: Stack) -> list[Sample]:
    load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, spec_for(stack),  # type: ignore[arg-type]
                                             rate=30, duration_s=6, arrival="fixed", timeout_s=10))
    await asyncio.sleep(1.5)
    stack.children["service"].send_signal(9)  # SIGKILL: no drain, like a crash
    await asyncio.sleep(2.0)
    stack.children["service"] = await start_service(group, stack)
    return await load


async def test_fail_closed(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch(group, tmp_path, [MAIN, SPARE], sim_args=["--profile", "fast"])
        samples = await kill_and_restart(group, stack)
    spare = f"127.0.0.1:{stack.sim_ports['spare'][0]}"
    assert not [s for s in samples if s.headers.get("x-gateway-upstream-host") == spare]
    failed = [s for s in samples if s.error is not None]
    assert failed, "killing the service must show in fail-closed mode"
    assert {s.status for s in failed} == {500}
    served_after = [s for s in samples if s.start_s > 4.5 and s.status == 200]
    assert len(served_after) >= 30  # the restarted service routes again (Envoy health-checks it back in)


async def test_fail_open_to_the_fallback_pool(tmp_path: Path) -> None:
    envoy = {"failure_mode_allow": True, "fallback_pool": "main", "message_timeout_ms": 200}
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch(group, tmp_path, [MAIN, SPARE], envoy=envoy, sim_args=["--profile", "fast"])
        samples = await kill_and_restart(group, stack)
    spare = f"127.0.0.1:{stack.sim_ports['spare'][0]}"
    assert [s for s in samples if s.error is not None] == []
    assert not [s for s in samples if s.headers.get("x-gateway-upstream-host") == spare]
