"""Child processes for benchmarks (Envoy, the service, simulators): start, wait for readiness, stop.

Only processes started through a ProcessGroup are ever signalled, by pidfd where the kernel has it (so a
recycled PID can never be hit) and by PID otherwise. Children run in their own session so a terminal
Ctrl-C reaches only the benchmark, which then stops them in order; on Linux they also get SIGTERM if the
benchmark dies without cleaning up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from extproc.bench.httpclient import HttpClient, RequestError
from extproc.server.workers import die_with_parent as parent_death

__all__ = [
    "Child",
    "ChildExited",
    "ProcessGroup",
    "cpu_seconds",
    "run_delay_seconds",
    "self_cpu_seconds",
    "tree_cpu_seconds",
    "wait_file",
    "wait_http_ok",
    "wait_port",
]



class ChildExited(RuntimeError):
    """A child ended while something was waiting for it to become ready."""


@dataclass(slots=True)
class Child:
    name: str
    argv: tuple[str, ...]
    process: asyncio.subprocess.Process
    log_path: Path
    pidfd: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def send_signal(self, sig: int) -> None:
        if not self.running:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def cpu_seconds(pid: int, *, include_children: bool = False) -> float:
    """utime+stime of `pid` from /proc/<pid>/stat (plus reaped children's if asked)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    # The command name may contain spaces and parentheses; the fields after the last ")" start at 3.
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])
    if include_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_delay_seconds(pid: int) -> float:
    """Time the threads of `pid` spent runnable but waiting for a CPU (the scheduler's run_delay, summed over
    /proc/<pid>/task/*/schedstat; threads that exited are not counted)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[1])
    return total / 1e9


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and every live descendant (a supervisor and its workers), plus the children it
    reaped; a descendant that exits between two reads loses its last moments."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            total += cpu_seconds(current, include_children=current == pid)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (ProcessLookupError, FileNotFoundError):
            continue
    return total


def self_cpu_seconds() -> float:
    """CPU time (user+system, all threads) of this process."""
    return time.process_time()


def _check_alive(child: Child | None) -> None:
    if child is not None and child.returncode is not None:
        raise ChildExited(
            f"{child.name} (pid {child.pid}) exited with {child.returncode}; log tail:\n{child.log_tail()}"
        )


def _timeout_message(what: str, timeout_s: float, child: Child | None) -> str:
    tail = f"; {child.name} log tail:\n{child.log_tail()}" if child is not None else ""
    return f"{what} not ready after {timeout_s}s{tail}"


async def wait_port(
    host: str, port: int, timeout_s: float, *, child: Child | None = None, interval_s: float = 0.05
) -> None:
    """Until a TCP connect to host:port succeeds. Raises ChildExited early if `child` dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), max(0.01, remaining))
        except (OSError, TimeoutError):
            pass
        else:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        _check_alive(child)
        if time.monotonic() >= deadline:
            raise TimeoutError(_timeout_message(f"{host}:{port}", timeout_s, child))
        await asyncio.sleep(interval_s)


async def wait_file(
    path: str | Path, timeout_s: float, *, child: Child | None = None, interval_s: float = 0.05
) -> None:
    """Until `path` exists. Raises ChildExited early if `child` dies."""
    path = Path(path)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        _check_alive(child)
        if time.monotonic() >= deadline:
            raise TimeoutError(_timeout_message(str(path), timeout_s, child))
        await asyncio.sleep(interval_s)


async def wait_http_ok(
    url: str, timeout_s: float, *, child: Child | None = None, interval_s: float = 0.1
) -> None:
    """Until GET `url` (http:// only) answers 2xx. Raises ChildExited early if `child` dies."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    port = parts.port or 80
    deadline = time.monotonic() + timeout_s
    async with HttpClient() as client:
        while True:
            remaining = deadline - time.monotonic()
            try:
                resp = await client.request(
                    "GET", parts.hostname, port, target, timeout_s=max(0.05, min(remaining, 2.0))
                )
                if 200 <= resp.status < 300:
                    return
            except RequestError:
                pass
            _check_alive(child)
            if time.monotonic() >= deadline:
                raise TimeoutError(_timeout_message(url, timeout_s, child))
            await asyncio.sleep(interval_s)


class ProcessGroup:
    """Children started for one benchmark; `async with` guarantees they are all stopped on exit."""

    def __init__(self, log_dir: str | Path, *, grace_s: float = 5.0, die_with_parent: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.grace_s = grace_s
        self._die_with_parent = die_with_parent
        self._children: list[Child] = []

    @property
    def children(self) -> tuple[Child, ...]:
        return tuple(self._children)

    async def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Child:
        """Start argv[0] with stdout+stderr appended to <log_dir>/<name>.log; `env` extends os.environ."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **env} if env is not None else None
        command, hook = list(argv), None
        if self._die_with_parent:
            command, hook = parent_death(argv)
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=full_env, cwd=cwd, start_new_session=True, preexec_fn=hook,
            )
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(process.pid)
        child = Child(name, tuple(argv), process, log_path, pidfd)
        self._children.append(child)
        return child

    def get(self, name: str) -> Child:
        """The most recently started child called `name`."""
        for child in reversed(self._children):
            if child.name == name:
                return child
        raise KeyError(name)

    async def stop(self, child: Child, *, grace_s: float | None = None) -> int:
        """SIGTERM, then SIGKILL after the grace period; returns the exit status."""
        if child not in self._children:
            raise ValueError(f"{child.name} (pid {child.pid}) was not started by this group")
        try:
            child.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(child.process.wait(), self.grace_s if grace_s is None else grace_s)
            except TimeoutError:
                child.send_signal(signal.SIGKILL)
            return await child.process.wait()
        finally:
            if child.returncode is not None:
                child.close_pidfd()

    async def stop_all(self) -> None:
        """Stop every child concurrently; safe to call more than once."""
        await asyncio.gather(*(self.stop(c) for c in self._children))

    def kill_all_now(self) -> None:
        """Synchronous SIGKILL to every running child: the fallback when there is no time to be polite."""
        for child in self._children:
            child.send_signal(signal.SIGKILL)

    def run_delays(self) -> dict[str, float]:
        """Seconds each running child's threads waited for a CPU so far, by name (`run_delay_seconds`)."""
        return {child.name: run_delay_seconds(child.pid) for child in self._children if child.running}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each running child, by name."""
        usage: dict[str, float] = {}
        for child in self._children:
            if child.running:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    usage[child.name] = cpu_seconds(child.pid)
        return usage

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.stop_all()
        except BaseException:
            self.kill_all_now()
            raise


_WORKER_LABEL = re.compile(r'worker="\d+",?')


async def metric_sums(admin_urls: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """Each Prometheus sample name in `names` (with labels as exposed, e.g. 'x{path="a"}') summed over
    the services' /metrics and their workers; absent samples are 0. Unreachable services count nothing."""
    sums = dict.fromkeys(names, 0.0)
    async with HttpClient() as client:
        for url in admin_urls:
            parts = urlsplit(url)
            try:
                response = await client.request("GET", parts.hostname or "127.0.0.1", parts.port or 80, "/metrics",
                                                timeout_s=5)
            except RequestError:
                continue
            for line in response.body.decode("utf-8", "replace").splitlines():
                name, _, value = line.rpartition(" ")
                if 'worker="' in name:  # `serve --workers N`: the supervisor labels each worker's samples
                    name = _WORKER_LABEL.sub("", name).replace(",}", "}").replace("{}", "")
                if name in sums:
                    sums[name] += float(value)
    return sums


async def start_redis(group: ProcessGroup, port: int, binary: str = "redis-server") -> Child:
    """A throwaway redis-server on 127.0.0.1:`port` (no persistence), ready to take connections."""
    child = await group.start("redis", [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                        "--appendonly", "no"])
    await wait_port("127.0.0.1", port, 10, child=child)
    return child
