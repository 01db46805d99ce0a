from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support import eventually

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_cli_writes_ready_file_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "extproc.sim", "--pool", f"org/m:1={port}", "--profile", "fast",
        "--ready-file", str(ready), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        def ready_file() -> bool:
            assert proc.returncode is None, "the simulator exited"
            return ready.exists()

        await eventually(ready_file, "the simulator's ready file", timeout_s=10)
        endpoints = json.loads(ready.read_text())
        assert endpoints == [{"model": "org/m:1", "url": f"http://127.0.0.1:{port}"}]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "org/m:1"
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert f"url=http://127.0.0.1:{port}" in out.decode()
    assert not ready.exists()


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_parked_simulator_listens_only_after_sigusr1(tmp_path: Path) -> None:
    ready, parked = tmp_path / "ready.json", tmp_path / "parked"
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "extproc.sim", "--pool", f"org/m={port}", "--profile", "fast",
        "--ready-file", str(ready), "--park-file", str(parked),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        def exists(path: Path) -> bool:
            assert proc.returncode is None, "the simulator exited"
            return path.exists()

        await eventually(lambda: exists(parked), "the simulator's park file", timeout_s=10)
        assert parked.read_text().strip() == str(proc.pid)
        assert refused(port) and not ready.exists()  # parked: nothing listens yet
        proc.send_signal(signal.SIGUSR1)
        await eventually(lambda: exists(ready), "the ready file after SIGUSR1", timeout_s=10)
        assert not refused(port)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert not ready.exists() and not parked.exists()


async def test_a_parked_simulator_stops_on_sigterm(tmp_path: Path) -> None:
    parked = tmp_path / "parked"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "extproc.sim", "--pool", f"org/m={free_port()}", "--profile", "fast",
        "--park-file", str(parked), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(lambda: parked.exists(), "the simulator's park file", timeout_s=10)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert not parked.exists()
