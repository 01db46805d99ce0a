"""`extproc bench routing --isolate`: the system under test and the harness on separate CPUs.

In a deployment the gateway (Envoy and our service, or a peer router) has CPUs of its own; the engines run on GPU
nodes and the clients elsewhere. On one benchmark machine the simulated engines and the load generator compete with
the router for the same cores, and a router's tail then measures the harness's bursts as much as the router.
Splitting the CPUs gives every strategy the same share: the system under test (Envoy, our service replicas and
their Redis, or a peer router) on one set, the simulator and the load generator (this process) on the other.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

__all__ = ["HARNESS_CHILDREN", "CpuSplit", "parse_split", "pin_process"]

if TYPE_CHECKING:
    from extproc.bench.procs import Child

# Children of a routing point that belong to the harness; every other child is the system under test.
HARNESS_CHILDREN = frozenset({"sim"})


@dataclass(frozen=True)
class CpuSplit:
    system: frozenset[int]  # Envoy, our service and its Redis, or a peer router
    harness: frozenset[int]  # the simulated engines and the load generator

    def pin_harness(self) -> None:
        """This process (the load generator) onto the harness's CPUs; children it starts inherit them."""
        pin_process(os.getpid(), self.harness)

    def pin(self, children: Iterable[Child]) -> None:
        """A point's running children: the simulator with the harness, the rest (the system under test) apart."""
        for child in children:
            if child.running:
                pin_process(child.pid, self.harness if child.name in HARNESS_CHILDREN else self.system)

    def describe(self) -> str:
        return f"system under test on CPUs {_listing(self.system)}, harness on {_listing(self.harness)}"


def _listing(cpus: Iterable[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def _cpu_list(text: str) -> frozenset[int]:
    """`0`, `0-3`, `0,2-3`: Linux's CPU list syntax."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ValueError(f"expected a CPU list such as 0 or 0-3 or 0,2-3, got {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"expected a CPU list such as 0 or 0-3 or 0,2-3, got {text!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def parse_split(text: str, available: Iterable[int] | None = None) -> CpuSplit | None:
    """`off`: no split (None); `auto`: the first half of the CPUs this process may use for the system under test
    (rounded down, at least one), the rest for the harness, or no split with fewer than two; a CPU list: those for
    the system under test, the rest for the harness. Raises ValueError on a list that leaves either side empty or
    names a CPU this process may not use."""
    cpus = frozenset(os.sched_getaffinity(0) if available is None else available)
    if text == "off":
        return None
    if text == "auto":
        if len(cpus) < 2:
            return None
        ordered = sorted(cpus)
        half = len(ordered) // 2
        return CpuSplit(frozenset(ordered[:half]), frozenset(ordered[half:]))
    system = _cpu_list(text)
    if not system <= cpus:
        raise ValueError(f"--isolate {text}: CPUs {_listing(system - cpus)} are not available "
                         f"(this process may use {_listing(cpus)})")
    if system == cpus:
        raise ValueError(f"--isolate {text}: leaves no CPU for the harness (available: {_listing(cpus)})")
    return CpuSplit(system, cpus - system)


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of `pid` onto `cpus` (sched_setaffinity on a pid moves only its main thread; threads it starts
    later inherit the affinity of the thread that starts them). A thread that ended meanwhile is skipped."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            continue
