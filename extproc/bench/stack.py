"""Start a whole local stack on 127.0.0.1: simulated vLLM fleet, our service, a real Envoy.

Used by `extproc demo`, the benchmarks and the integration tests, so all three run the same way.
Every child belongs to the caller's ProcessGroup, which stops them all on exit or error.
"""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extproc.bench.procs import Child, ProcessGroup, wait_file, wait_http_ok, wait_port
from extproc.config import Policy, parse_policy
from extproc.xds import find_envoy, write_config

PYTHON = sys.executable


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now, held together so the set has no duplicates."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port_block(count: int, attempts: int = 200) -> int:
    """The first of `count` consecutive free ports (a supervisor's admin port and its workers' after it), outside
    the kernel's ephemeral range: inside it, on a busy machine, the neighbours of a free port are often held by
    outgoing connections."""
    low, high = _ephemeral_range()
    chooser = random.Random()
    spans = [(span_low, span_high - count) for span_low, span_high in ((10_000, low - 1), (high + 1, 65_535))
             if span_high - count >= span_low]
    for _ in range(attempts):
        span_low, span_high = chooser.choice(spans)
        base = chooser.randint(span_low, span_high)
        if _all_free(range(base, base + count), reuse_address=False):
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


def _all_free(ports: Sequence[int], reuse_address: bool = True) -> bool:
    """Whether a server may listen on every one of `ports` now. `reuse_address` (SO_REUSEADDR, as the simulator's
    server binds): the connections a stopped engine closed linger in TIME_WAIT on its port for a minute, and a
    plain bind fails on that (the ports were never reused in session 12's first run with held ports); without it,
    for ports never used yet, also none in TIME_WAIT."""
    sockets: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket()
            sockets.append(sock)
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def held_ports(count: int, previous: Sequence[int] | None = None) -> list[int]:
    """`previous` again while every one of them is free, else `count` consecutive free ports outside the kernel's
    ephemeral range (where the outgoing connections made between two stacks do not take them)."""
    if previous is not None and len(previous) == count and _all_free(previous):
        return list(previous)
    base = free_port_block(count)
    return list(range(base, base + count))


@dataclass(frozen=True)
class SimPool:
    """A pool of simulated vLLM replicas serving one model."""

    name: str
    model: str
    replicas: int
    aliases: tuple[str, ...] = ()
    lora: tuple[str, ...] = ()
    profile: str = "default"  # scheduling profile of the pool in the policy
    max_num_seqs: int | None = None  # the engines' seats, told to the policy (None: learned)
    options: tuple[tuple[str, Any], ...] = ()  # more `pools[]` keys of the policy, e.g. cold_start_timeout_s


@dataclass
class Stack:
    workdir: Path
    policy: Policy
    policy_path: Path
    envoy_dir: Path
    sim_ports: dict[str, list[int]]
    # (grpc, admin) port of every service replica; the first one is the policy's `service` ports.
    service_ports: list[tuple[int, int]] = field(default_factory=list)
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def envoy_port(self) -> int:
        return self.policy.envoy.listen_port

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.policy.service.admin_port}"

    @property
    def admin_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{admin}" for _, admin in self.service_ports]

    @property
    def envoy_admin_url(self) -> str:
        return f"http://127.0.0.1:{self.policy.envoy.admin_port}"


def build_policy(
    pools: Sequence[SimPool], sim_ports: Mapping[str, Sequence[int]], service_ports: Sequence[int],
    envoy: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    grpc_port, admin_port, listen_port, envoy_admin = service_ports
    extra = dict(extra or {})
    return {
        "service": {"grpc_port": grpc_port, "admin_port": admin_port, **extra.pop("service", {})},
        "envoy": {"listen_port": listen_port, "admin_port": envoy_admin, "expose_upstream_host": True,
                  **(envoy or {})},
        "pools": [
            {"name": p.name, "model": p.model, "aliases": list(p.aliases), "lora_adapters": list(p.lora),
             "profile": p.profile, "endpoints": [f"127.0.0.1:{port}" for port in sim_ports[p.name]],
             **({"max_num_seqs": p.max_num_seqs} if p.max_num_seqs is not None else {}), **dict(p.options)}
            for p in pools
        ],
        **extra,
    }


async def start_sim(group: ProcessGroup, workdir: Path, pools: Sequence[SimPool],
                    sim_ports: Mapping[str, Sequence[int]], extra_args: Sequence[str] = ()) -> Child:
    ready = workdir / "sim-ready.json"
    ready.unlink(missing_ok=True)
    argv = [PYTHON, "-m", "extproc", "sim", "--ready-file", str(ready), *extra_args]
    for pool in pools:
        argv += ["--pool", f"{pool.model}={','.join(str(p) for p in sim_ports[pool.name])}"]
        if pool.lora:
            argv += ["--lora", f"{pool.model}={','.join(pool.lora)}"]
    child = await group.start("sim", argv)
    await wait_file(ready, 30, child=child)
    return child


async def start_service(group: ProcessGroup, stack: Stack, index: int = 0, *, grace_s: float | None = None,
                        drain_delay_s: float = 0.0) -> Child:
    """Service replica `index`, ready. The drain delay defaults to 0, not the product's 3 s: these stacks stop
    the service at their end (a benchmark point, a test's teardown), where no health check needs the time to
    move traffic away; a test of draining passes its own. `grace_s` None keeps the product's default."""
    grpc_port, admin_port = stack.service_ports[index]
    name = "service" if index == 0 else f"service-{index}"
    argv = [PYTHON, "-m", "extproc", "serve", "--config", str(stack.policy_path),
            "--grpc-port", str(grpc_port), "--admin-port", str(admin_port), "--drain-delay", str(drain_delay_s)]
    if grace_s is not None:
        argv += ["--grace", str(grace_s)]
    child = await group.start(name, argv)
    await wait_http_ok(f"http://127.0.0.1:{admin_port}/readyz", 30, child=child)
    return child


async def start_envoy(group: ProcessGroup, stack: Stack, concurrency: int = 1) -> Child:
    argv = [find_envoy(), "-c", str(stack.envoy_dir / "bootstrap.yaml"), "--log-level", "warn",
            "--concurrency", str(concurrency), "--disable-hot-restart"]
    child = await group.start("envoy", argv)
    await wait_http_ok(f"{stack.envoy_admin_url}/ready", 30, child=child)
    await wait_port("127.0.0.1", stack.envoy_port, 10, child=child)
    return child


def prepare(
    workdir: Path, pools: Sequence[SimPool], *, envoy: Mapping[str, Any] | None = None,
    extra_policy: Mapping[str, Any] | None = None, service_replicas: int = 1, service_workers: int = 1,
    engine_ports: Sequence[int] | None = None,
) -> Stack:
    """Pick ports, write the policy and render Envoy's files (setup-time file I/O, before any child).
    `engine_ports`: the simulated engines' ports, in pool order (see `held_ports`), instead of new ones."""
    workdir.mkdir(parents=True, exist_ok=True)
    engines = sum(p.replicas for p in pools)
    others = 4 + 2 * (service_replicas - 1)
    if engine_ports is None:
        ports = free_ports(engines + others)
    elif len(engine_ports) != engines:
        raise ValueError(f"{len(engine_ports)} engine ports for {engines} engines")
    else:
        ports = [*engine_ports, *[p for p in free_ports(engines + others) if p not in engine_ports][:others]]
    if service_workers > 1:  # the supervisor's admin port, its workers' right after it
        if service_replicas > 1:
            raise ValueError("a stack runs either several service replicas or one with several workers")
        index = sum(p.replicas for p in pools) + 1
        ports[index] = free_port_block(service_workers + 1)
    sim_ports: dict[str, list[int]] = {}
    for pool in pools:
        sim_ports[pool.name], ports = ports[: pool.replicas], ports[pool.replicas:]
    service_ports = [(ports[0], ports[1])]
    extra_ports = ports[4:]
    service_ports += [(extra_ports[2 * i], extra_ports[2 * i + 1]) for i in range(service_replicas - 1)]
    envoy_settings = dict(envoy or {})
    if service_replicas > 1:
        envoy_settings["extproc_endpoints"] = [f"127.0.0.1:{grpc}" for grpc, _ in service_ports]
    document = build_policy(pools, sim_ports, ports[:4], envoy_settings, extra_policy)
    if service_workers > 1:
        document["service"]["workers"] = service_workers
    policy_path = workdir / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
    policy = parse_policy(policy_path.read_text(), str(policy_path))
    envoy_dir = workdir / "envoy"
    write_config(policy, envoy_dir)
    return Stack(workdir, policy, policy_path, envoy_dir.resolve(), sim_ports, service_ports)


async def launch(
    group: ProcessGroup, workdir: Path, pools: Sequence[SimPool], *,
    envoy: Mapping[str, Any] | None = None, extra_policy: Mapping[str, Any] | None = None,
    sim_args: Sequence[str] = (), envoy_concurrency: int = 1, service_replicas: int = 1, service_workers: int = 1,
) -> Stack:
    """Fleet first, then the service replicas, then Envoy (whose ext_proc cluster health-checks them)."""
    stack = prepare(workdir, pools, envoy=envoy, extra_policy=extra_policy, service_replicas=service_replicas,
                    service_workers=service_workers)
    stack.children["sim"] = await start_sim(group, workdir, pools, stack.sim_ports, sim_args)
    for index in range(service_replicas):
        child = await start_service(group, stack, index)
        stack.children[child.name] = child
    stack.children["envoy"] = await start_envoy(group, stack, envoy_concurrency)
    return stack
