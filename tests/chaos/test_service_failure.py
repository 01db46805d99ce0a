"""Our own service killed under load: fail-closed answers 500, fail-open serves the fallback pool.

In neither mode can a client pick a pool or endpoint by sending our routing headers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool
from tests.support import kill_and_restart, launch_stack

pytestmark = pytest.mark.asyncio

MAIN = SimPool("main", "org/main", 2, aliases=("main",))
SPARE = SimPool("spare", "org/spare", 1, aliases=("spare",))


async def test_fail_closed(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch_stack(group, tmp_path, [MAIN, SPARE], sim_args=["--profile", "fast"])
        outage = await kill_and_restart(group, stack)
    samples = outage.samples
    spare = f"127.0.0.1:{stack.sim_ports['spare'][0]}"
    assert not [s for s in samples if s.headers.get("x-gateway-upstream-host") == spare]
    failed = [s for s in samples if s.error is not None]
    assert failed, "killing the service must show in fail-closed mode"
    assert {s.status for s in failed} == {500}
    assert all(outage.killed_s - 0.1 < s.start_s < outage.back_s + 0.5 for s in failed)  # during the outage
    served_after = [s for s in samples if s.start_s > outage.back_s and s.status == 200]
    assert len(served_after) >= 10  # the restarted service routes again (Envoy health-checks it back in)


async def test_fail_open_to_the_fallback_pool(tmp_path: Path) -> None:
    envoy = {"failure_mode_allow": True, "fallback_pool": "main", "message_timeout_ms": 200}
    async with ProcessGroup(tmp_path / "logs") as group:
        stack = await launch_stack(group, tmp_path, [MAIN, SPARE], envoy=envoy, sim_args=["--profile", "fast"])
        outage = await kill_and_restart(group, stack)
    samples = outage.samples
    spare = f"127.0.0.1:{stack.sim_ports['spare'][0]}"
    assert [s for s in samples if s.error is not None] == []
    assert not [s for s in samples if s.headers.get("x-gateway-upstream-host") == spare]
