"""Peer routers as front doors of `extproc bench routing`: sglang-router (`smg`) and vllm-router.

Each peer runs as a child process bound to 127.0.0.1 on free ports (API and Prometheus), pointed at the
simulated replicas of one pool, with its log in the benchmark's log directory. It is ready when its own
worker list names every replica (smg registers workers in the background after it starts listening, so
an answered /health is not enough). It is stopped by PID, and so are the processes it started, if any.

A peer whose prefix policy silently falls back (vllm-router without token ids from the workers routes
every request to one worker; smg without a radix tree picks at random) is no baseline, so every point
reads the peer's own Prometheus counters before and after the run and `policy_check` says whether the
named policy made the decisions. What the routers call on their workers and how their policies work is
in `extproc/bench/README.md` ("Peer routers"); the simulator's side is `extproc/sim/router_routes.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from extproc.bench.httpclient import HttpClient, RequestError
from extproc.bench.procs import Child, ProcessGroup, wait_http_ok
from extproc.bench.stack import free_ports

__all__ = [
    "PEERS",
    "Peer",
    "PeerRouter",
    "fallback_lines",
    "find_binary",
    "parse_samples",
    "peer_summary",
    "policy_check",
    "scrape_peer",
    "start_peer",
    "stop_peer",
]

_READY_TIMEOUT_S = 60.0

# A Prometheus sample: (metric name, its labels) -> value.
SampleKey = tuple[str, frozenset[tuple[str, str]]]
Samples = Mapping[SampleKey, float]


@dataclass(frozen=True)
class PeerRouter:
    """How to launch one peer strategy and how to tell, from its metrics and log, that its policy ran."""

    strategy: str
    package: str  # the PyPI distribution (in the `bench` extra)
    binary: str
    policy: str
    subcommand: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    # Counter (Prometheus sample name, label filter) whose delta counts the policy's own decisions.
    decisions: tuple[str, Mapping[str, str]] = ("", MappingProxyType({}))
    # Counters whose label values other than the listed ones mean a fallback, as (name, label, good values).
    fallbacks: tuple[tuple[str, str, frozenset[str]], ...] = ()
    # Debug-level log lines that mean a fallback.
    fallback_log: tuple[str, ...] = ()
    # A regex the log must match at least once after a run that served requests (the policy's own trace).
    evidence: str = ""
    workers_path: str = "/workers"

    def argv(self, binary: str, port: int, metrics_port: int, workers: Sequence[str], log_level: str) -> list[str]:
        return [binary, *self.subcommand, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                "--policy", self.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--log-level", log_level, *self.extra_args]


_VLLM_INPUTS = ("vllm_router_kv_routing_inputs_total", "result", frozenset({"render", "tokenize"}))
_VLLM_DECISIONS = ("vllm_router_prefix_routing_decisions_total", "outcome",
                   frozenset({"prefix_hit", "prefix_miss", "load_imbalance"}))
# vllm-router polls /get_load every --worker-startup-check-interval seconds (default 30) for power_of_two and
# compares those figures; 1 s keeps them fresh. For cache_aware it only shortens the start-up health polling.
_VLLM_ARGS = ("--worker-startup-check-interval", "1")

PEERS: Mapping[str, PeerRouter] = MappingProxyType({
    "sglang-cache-aware": PeerRouter(
        "sglang-cache-aware", "sglang-router", "smg", "cache_aware", subcommand=("launch",),
        decisions=("smg_worker_selection_total", MappingProxyType({"policy": "cache_aware"})),
        fallback_log=("using random worker selection", "No tree found for model"),
    ),
    "vllm-router-cache-aware": PeerRouter(
        "vllm-router-cache-aware", "vllm-router", "vllm-router", "cache_aware", extra_args=_VLLM_ARGS,
        decisions=("vllm_router_policy_decisions_total", MappingProxyType({"policy": "cache_aware"})),
        fallbacks=(_VLLM_INPUTS, _VLLM_DECISIONS),
        fallback_log=("Prefix input preparation unavailable",),
        workers_path="/list_workers",
    ),
    "vllm-router-power-of-two": PeerRouter(
        "vllm-router-power-of-two", "vllm-router", "vllm-router", "power_of_two", extra_args=_VLLM_ARGS,
        decisions=("vllm_router_policy_decisions_total", MappingProxyType({"policy": "power_of_two"})),
        fallback_log=("returned non-success status", "Failed to get load from", "Failed to parse load response"),
        # Loads all zero would mean /get_load feeds it nothing and the choice is random: one nonzero suffices.
        evidence=r"Power-of-two selection: \S+=[1-9]|vs \S+=[1-9]",
        workers_path="/list_workers",
    ),
})


def find_binary(name: str) -> str:
    """The console script next to this interpreter (the venv's), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install the bench extra (pip install -e '.[bench]')")
    return found


@dataclass
class Peer:
    router: PeerRouter
    child: Child
    port: int
    metrics_port: int
    workers: tuple[str, ...]
    started_s: float = field(default_factory=time.monotonic)

    @property
    def log_path(self) -> Path:
        return self.child.log_path


def parse_samples(text: str) -> dict[SampleKey, float]:
    """Prometheus text -> {(name, labels): value}; label values with commas or escapes are not expected."""
    samples: dict[SampleKey, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: list[tuple[str, str]] = []
        for pair in rest.rstrip("}").split(","):
            key, sep, raw = pair.partition("=")
            if sep:
                labels.append((key.strip(), raw.strip().strip('"')))
        with contextlib.suppress(ValueError):
            samples[(name, frozenset(labels))] = float(value)
    return samples


async def scrape_peer(client: HttpClient, peer: Peer) -> dict[SampleKey, float]:
    try:
        response = await client.request("GET", "127.0.0.1", peer.metrics_port, "/metrics", timeout_s=5.0)
    except RequestError:
        return {}
    return parse_samples(response.body.decode("utf-8", "replace")) if response.status == 200 else {}


def _delta(before: Samples, after: Samples) -> dict[SampleKey, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items() if value - before.get(key, 0.0)}


def policy_check(router: PeerRouter, before: Samples, after: Samples, served: int) -> dict[str, Any]:
    """Did the peer's named policy decide the `served` requests of a run, with no fallback?"""
    delta = _delta(before, after)
    name, wanted = router.decisions
    decisions = sum(v for (n, labels), v in delta.items() if n == name and set(wanted.items()) <= labels)
    fallbacks: dict[str, float] = {}
    breakdown: dict[str, float] = {}
    for counter, label, good in router.fallbacks:
        for (n, labels), value in delta.items():
            if n != counter:
                continue
            kind = dict(labels).get(label, "")
            breakdown[f"{counter}:{kind}"] = breakdown.get(f"{counter}:{kind}", 0.0) + value
            if kind not in good:
                fallbacks[f"{counter}:{kind}"] = fallbacks.get(f"{counter}:{kind}", 0.0) + value
    return {"policy": router.policy, "decisions": int(decisions), "served": served,
            "fallbacks": {k: int(v) for k, v in fallbacks.items()},
            "counters": {k: int(v) for k, v in breakdown.items()},
            "ok": not fallbacks and decisions >= served}


def peer_summary(peer: Peer, before: Samples, after: Samples, served: int, log_copy: Path) -> dict[str, Any]:
    """What a report says about one peer run: its command, the policy check and a copy of its log."""
    log_copy.parent.mkdir(parents=True, exist_ok=True)
    text = peer.log_path.read_text(encoding="utf-8", errors="replace") if peer.log_path.exists() else ""
    log_copy.write_text(text, encoding="utf-8")
    check = policy_check(peer.router, before, after, served)
    lines = fallback_lines(peer.router, text)
    traced = not peer.router.evidence or served == 0 or re.search(peer.router.evidence, text) is not None
    check["ok"] = check["ok"] and not lines and traced
    return {"router": peer.router.package, "argv": list(peer.child.argv), "log": str(log_copy),
            "policy_check": check, "fallback_log_lines": lines, "log_evidence": traced}


def fallback_lines(router: PeerRouter, log_text: str, limit: int = 5) -> list[str]:
    """Log lines that show a fallback (they are logged at debug level only)."""
    hits = [line for line in log_text.splitlines() if any(marker in line for marker in router.fallback_log)]
    return hits[:limit]


async def _listed_workers(client: HttpClient, peer: Peer) -> set[str]:
    response = await client.request("GET", "127.0.0.1", peer.port, peer.router.workers_path, timeout_s=2.0)
    if response.status != 200:
        return set()
    body = json.loads(response.body)
    if "urls" in body:  # vllm-router
        return set(body["urls"])
    return {w["url"] for w in body.get("workers", []) if w.get("is_healthy")}  # smg


async def _wait_workers(peer: Peer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wanted = set(peer.workers)
    async with HttpClient() as client:
        while True:
            listed: set[str] = set()
            with contextlib.suppress(RequestError, ValueError, KeyError, TypeError):
                listed = await _listed_workers(client, peer)
            if wanted <= listed:
                return
            if not peer.child.running:
                raise RuntimeError(f"{peer.router.binary} exited with {peer.child.returncode}; log tail:\n"
                                   f"{peer.child.log_tail()}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{peer.router.binary} lists {sorted(listed)}, not all of {sorted(wanted)} "
                                   f"after {timeout_s}s; log tail:\n{peer.child.log_tail()}")
            await asyncio.sleep(0.1)


async def start_peer(group: ProcessGroup, strategy: str, workers: Sequence[str], *, log_level: str = "info",
                     timeout_s: float = _READY_TIMEOUT_S) -> Peer:
    """Start peer `strategy` in front of `workers` (http://host:port) and wait until it routes to all."""
    router = PEERS[strategy]
    port, metrics_port = free_ports(2)
    argv = router.argv(find_binary(router.binary), port, metrics_port, workers, log_level)
    # The simulator names no model path, so no peer should fetch a tokenizer; offline mode makes sure.
    child = await group.start(router.binary, argv, env={"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
    peer = Peer(router, child, port, metrics_port, tuple(workers))
    await wait_http_ok(f"http://127.0.0.1:{port}/health", timeout_s, child=child)
    await _wait_workers(peer, timeout_s)
    return peer


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid`, read from /proc (Linux); empty elsewhere."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = Path(entry.path, "stat").read_text()
                if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _descendant_fds(pid: int) -> list[int]:
    """pidfds of every descendant of `pid`, opened now so a recycled PID can never be signalled later."""
    fds: list[int] = []
    pending = _children(pid)
    while pending:
        child = pending.pop()
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(child))
            pending.extend(_children(child))
    return fds


async def stop_peer(group: ProcessGroup, peer: Peer, grace_s: float = 5.0) -> None:
    """SIGTERM the peer (SIGKILL after the grace period), then whatever it started and left running."""
    fds = _descendant_fds(peer.child.pid) if peer.child.running else []
    try:
        await group.stop(peer.child, grace_s=grace_s)
        for fd in fds:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        for fd in fds:
            os.close(fd)
