"""The bench's process group: readiness probes against real ports (a local server, a closed port), and children
stopped when the process that started them dies."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from extproc.bench.procs import ChildExited, ProcessGroup, wait_http_ok, wait_port
from tests.support import eventually

from .conftest import Server

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_wait_port(server: Server, tmp_path: Path) -> None:
    await wait_port("127.0.0.1", server.port, 1.0)
    await wait_http_ok(f"http://127.0.0.1:{server.port}/json", 1.0)
    with pytest.raises(TimeoutError):
        await wait_http_ok(f"http://127.0.0.1:{server.port}/status/503", 0.2)
    async with ProcessGroup(tmp_path) as group:
        doomed = await group.start("doomed", [sys.executable, "-c", "raise SystemExit(4)"])
        with pytest.raises(ChildExited, match="exited with 4"):
            await wait_port("127.0.0.1", _closed_port(), 5.0, child=doomed)


async def test_wait_port_times_out_on_closed_port() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await wait_port("127.0.0.1", _closed_port(), 0.2)
    assert time.monotonic() - start < 2.0  # the 0.2 s bound is the behaviour: it gives up, it does not hang


_ORPHANING_PARENT = """
import asyncio, sys
from extproc.bench.procs import ProcessGroup

async def main() -> None:
    group = ProcessGroup(sys.argv[1])
    child = await group.start("sleeper", ["sleep", "60"])
    print(child.pid, flush=True)
    sys.stdin.readline()  # the test kills this process here, without any cleanup

asyncio.run(main())
"""


async def test_children_are_stopped_when_the_process_that_started_them_dies(tmp_path: Path) -> None:
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", _ORPHANING_PARENT, str(tmp_path),
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert parent.stdout is not None
    child_pid = int(await asyncio.wait_for(parent.stdout.readline(), 30))

    def exec_done() -> bool:  # setpriv execs the command: same pid
        return Path(f"/proc/{child_pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"

    await eventually(exec_done, "the child running the command", timeout_s=10)
    parent.send_signal(signal.SIGKILL)
    await parent.wait()

    def gone() -> bool:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return True
        state = Path(f"/proc/{child_pid}/stat").read_text().split(") ")[1][0]
        assert state == "Z", f"child {child_pid} still running (state {state})"  # a zombie awaiting its reaper
        return True

    await eventually(gone, "the orphaned child stopped by its parent-death signal", timeout_s=10)
