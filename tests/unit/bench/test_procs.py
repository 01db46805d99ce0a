from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from extproc.bench.procs import (
    ProcessGroup,
    cpu_seconds,
    self_cpu_seconds,
    wait_file,
)

SLEEPER = [sys.executable, "-c", "import signal; signal.pause()"]  # lives until signalled


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_stop_all_ends_children(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path, grace_s=2.0)
    children = [await group.start(f"sleeper{i}", SLEEPER) for i in range(2)]
    assert all(c.running and not _gone(c.pid) for c in children)
    await group.stop_all()
    assert all(_gone(c.pid) for c in children)
    assert [c.returncode for c in children] == [-15, -15]
    await group.stop_all()  # idempotent


async def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); print('stubborn', flush=True); signal.pause()"
    )
    async with ProcessGroup(tmp_path, grace_s=0.2) as group:
        child = await group.start("stubborn", [sys.executable, "-c", code])
        await wait_file(ready, 5.0, child=child)
    assert child.returncode == -9
    assert _gone(child.pid)
    assert "stubborn" in child.log_tail()


async def test_context_manager_stops_children_on_error_and_cancel(tmp_path: Path) -> None:
    pids: list[int] = []
    with pytest.raises(ValueError):
        async with ProcessGroup(tmp_path) as group:
            pids.append((await group.start("a", SLEEPER)).pid)
            raise ValueError("boom")
    assert _gone(pids[0])

    started = asyncio.Event()

    async def bench() -> None:
        async with ProcessGroup(tmp_path) as group:
            pids.append((await group.start("b", SLEEPER)).pid)
            started.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(bench())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _gone(pids[1])


async def test_env_and_log_file(tmp_path: Path) -> None:
    async with ProcessGroup(tmp_path / "logs") as group:
        child = await group.start(
            "printer", [sys.executable, "-c", "import os, sys; print(os.environ['BENCH_X']); sys.exit(3)"],
            env={"BENCH_X": "hello"},
        )
        assert await child.process.wait() == 3
        assert group.get("printer") is child
    assert (tmp_path / "logs" / "printer.log").read_text() == "hello\n"


async def test_wait_file_times_out(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError):
        await wait_file(tmp_path / "never", 0.1)


async def test_cpu_seconds(tmp_path: Path) -> None:
    before = cpu_seconds(os.getpid())
    self_before = self_cpu_seconds()
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) > before
    assert self_cpu_seconds() - self_before >= 0.1
    async with ProcessGroup(tmp_path) as group:
        child = await group.start("s", SLEEPER)
        usage = group.cpu_seconds()
        assert set(usage) == {"s"} and usage["s"] >= 0.0
    with pytest.raises(ProcessLookupError):
        cpu_seconds(child.pid)
