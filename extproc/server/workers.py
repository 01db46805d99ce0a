"""`extproc serve --workers N`: N service processes on one gRPC port, and the supervisor that keeps them running.

Each worker is a whole service (`extproc serve --worker I/N`) that binds the gRPC port with SO_REUSEPORT; the
kernel spreads Envoy's connections over them. Workers share nothing but the limits store: with Redis they are
replicas in one pod (exact shared limits, shared rollout state, in-flight counts through fleet sync); with the
memory store each worker enforces the limits on its own share of the connections (README "Workers").

Envoy multiplexes the ext_proc streams of one of its threads on one HTTP/2 connection, and one connection
lands on one worker. So the rendered Envoy config caps the streams per connection when `service.workers` is
above 1 (extproc/xds/render.py: more load, more connections), and workers age their connections out (GOAWAY
after `CONNECTION_AGE_S`, streams in flight keep going): the kernel re-spreads the new ones.

The supervisor restarts a worker that exits (backoff 0.5 s doubling to 30 s, reset after a minute of life),
forwards SIGTERM/SIGINT so every worker drains as a single service would, and owns the admin port: /metrics
(every worker's page, each sample labelled `worker`), /healthz (the workers' pids and restarts), /readyz
(ready while any worker is). Each worker's own admin API, /debug and /rollouts included, listens on
admin_port + 1 + its index.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

__all__ = ["CONNECTION_AGE_S", "Supervisor", "die_with_parent", "merge_metrics", "worker_admin_port"]

CONNECTION_AGE_S = 30.0  # then GOAWAY: Envoy reconnects, and the kernel spreads the new connection
CONNECTION_AGE_GRACE_S = 900.0  # streams in flight on an aged connection may run this much longer
_BACKOFF_S = (0.5, 30.0)
_HEALTHY_AFTER_S = 60.0
_PR_SET_PDEATHSIG = 1


def worker_admin_port(admin_port: int, index: int) -> int:
    return admin_port + 1 + index


def die_with_parent(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The command and preexec hook that start argv so the child gets SIGTERM when its starter dies (Linux).

    setpriv (util-linux) sets the parent-death signal and execs argv: no Python runs between fork and exec. A
    Python preexec hook is the fallback only: Python code in a child forked from a process holding gRPC threads
    can crash before exec (seen: SIGSEGV in the child). Elsewhere than Linux: argv unchanged, no hook.
    """
    if not sys.platform.startswith("linux"):
        return list(argv), None
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--", *argv], None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return list(argv), None
    parent = os.getpid()
    term = int(signal.SIGTERM)

    def hook() -> None:  # runs in the forked child before exec: no imports, no allocations to speak of
        prctl(_PR_SET_PDEATHSIG, term)
        if os.getppid() != parent:
            os.kill(os.getpid(), term)

    return list(argv), hook


def merge_metrics(pages: Iterable[tuple[str, str]]) -> bytes:
    """Prometheus text pages of (worker, page) as one page, every sample labelled with its worker."""
    families: dict[str, Metric] = {}
    for worker, page in pages:
        for family in text_string_to_metric_families(page):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, "worker": worker}, sample.value, sample.timestamp)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(list(families.values())))
    return generate_latest(registry)


@dataclass(eq=False)  # hashable: the registry keys collectors by identity
class _Collected:
    families: list[Metric]

    def collect(self) -> list[Metric]:
        return self.families


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = _BACKOFF_S[0]
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Starts `count` workers from `argv(index)`, restarts those that exit, serves the aggregate admin port."""

    def __init__(self, count: int, argv: Callable[[int], Sequence[str]], admin_host: str, admin_port: int,
                 stop_timeout_s: float) -> None:
        self._argv = argv
        self._admin_host = admin_host
        self._admin_port = admin_port
        self._stop_timeout_s = stop_timeout_s
        self._workers = [_Worker(index) for index in range(count)]
        self._stopping = False
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = web.AppRunner(self._admin_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self._admin_host, self._admin_port).start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        keepers = [asyncio.create_task(self._keep(worker), name=f"worker-{worker.index}")
                   for worker in self._workers]
        log.info("supervising %d workers; admin on %s:%d (workers' own: %d-%d)", len(self._workers),
                 self._admin_host, self._admin_port, worker_admin_port(self._admin_port, 0),
                 worker_admin_port(self._admin_port, len(self._workers) - 1))
        await stop.wait()
        self._stopping = True
        log.info("stopping: every worker drains")
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        _, pending = await asyncio.wait(keepers, timeout=self._stop_timeout_s)
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                log.warning("worker %d did not stop in %.0f s: killed", worker.index, self._stop_timeout_s)
                worker.process.kill()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._session.close()
        await runner.cleanup()
        return 0

    async def _keep(self, worker: _Worker) -> None:
        """Run the worker until the supervisor stops; restart it (with backoff) whenever it exits."""
        while not self._stopping:
            command, hook = die_with_parent(self._argv(worker.index))
            worker.process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, preexec_fn=hook)
            worker.started_at = time.monotonic()
            code = await worker.process.wait()
            if self._stopping:
                return
            worker.exits.append(code)
            lived = time.monotonic() - worker.started_at
            if lived >= _HEALTHY_AFTER_S:
                worker.backoff_s = _BACKOFF_S[0]
            log.error("worker %d (pid %d) exited with %d after %.1f s; restarting in %.1f s", worker.index,
                      worker.process.pid, code, lived, worker.backoff_s)
            await asyncio.sleep(worker.backoff_s)
            worker.backoff_s = min(_BACKOFF_S[1], worker.backoff_s * 2)
            worker.restarts += 1

    def _admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _get(self, index: int, path: str) -> tuple[int, str]:
        assert self._session is not None
        host = "127.0.0.1" if self._admin_host in ("0.0.0.0", "::", "") else self._admin_host
        if ":" in host:
            host = f"[{host}]"
        url = f"http://{host}:{worker_admin_port(self._admin_port, index)}{path}"
        try:
            async with self._session.get(url) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def _metrics(self, _: web.Request) -> web.Response:
        answers = await asyncio.gather(*(self._get(w.index, "/metrics") for w in self._workers))
        pages = [(str(w.index), text) for w, (status, text) in zip(self._workers, answers, strict=True)
                 if status == 200]
        own = "\n".join([
            "# HELP extproc_workers Worker processes running under the supervisor",
            "# TYPE extproc_workers gauge",
            f"extproc_workers {sum(1 for w in self._workers if _alive(w))}",
            "# HELP extproc_worker_restarts_total Worker processes restarted after they exited",
            "# TYPE extproc_worker_restarts_total counter",
            *(f'extproc_worker_restarts_total{{worker="{w.index}"}} {w.restarts}' for w in self._workers), ""])
        body = merge_metrics(pages) + own.encode()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        workers = [{"worker": w.index, "pid": w.process.pid if w.process is not None else None,
                    "running": _alive(w), "restarts": w.restarts, "exit_codes": w.exits[-5:],
                    "admin_port": worker_admin_port(self._admin_port, w.index)} for w in self._workers]
        return web.json_response({"status": "ok", "workers": workers})

    async def _readyz(self, _: web.Request) -> web.Response:
        if self._stopping:
            return web.Response(status=503, text="draining\n")
        answers = await asyncio.gather(*(self._get(w.index, "/readyz") for w in self._workers))
        ready = sum(1 for status, _ in answers if status == 200)
        return web.Response(status=200 if ready else 503, text=f"{ready}/{len(self._workers)} workers ready\n")


def _alive(worker: _Worker) -> bool:
    return worker.process is not None and worker.process.returncode is None
