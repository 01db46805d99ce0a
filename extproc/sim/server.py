"""A fleet of simulated replicas sharing one event loop, each on its own port."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from extproc.sim.faults import FaultSettings
from extproc.sim.openai_routes import RenderMemo
from extproc.sim.replica import Replica
from extproc.sim.spec import ReplicaSpec

__all__ = ["Fleet"]


class Fleet:
    """Starts and stops replicas together; `async with Fleet(specs) as fleet:` is the usual form."""

    def __init__(self, specs: Sequence[ReplicaSpec]) -> None:
        self.specs = list(specs)
        addresses = [(s.host, s.port) for s in self.specs if s.port != 0]
        if len(set(addresses)) != len(addresses):
            raise ValueError("two replicas share one host:port")
        self.renders = RenderMemo()  # one per process: see RenderMemo
        self.replicas: list[Replica] = [Replica(spec, siblings=self.replica_on, renders=self.renders)
                                        for spec in self.specs]
        self._started = False

    def replica_on(self, port: int) -> Replica | None:
        for replica in self.replicas:
            if replica.port == port:
                return replica
        return None

    @property
    def endpoints(self) -> list[dict[str, str]]:
        """`[{model, url}]` for every replica, in spec order (the `--ready-file` content)."""
        return [{"model": r.spec.model, "url": r.url} for r in self.replicas]

    async def start(self) -> None:
        """Listen on every port; if one fails, the ones already started are stopped again."""
        if self._started:
            return
        started: list[Replica] = []
        try:
            for replica in self.replicas:
                await replica.start()
                started.append(replica)
        except BaseException:
            for replica in reversed(started):
                await replica.stop()
            raise
        self._started = True

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for replica in self.replicas:
            await replica.stop()

    async def set_faults(self, update: Mapping[str, Any], port: int | None = None) -> list[FaultSettings]:
        """Apply a fault update to one replica (by port) or to all of them."""
        targets = self.replicas if port is None else [r for r in self.replicas if r.port == port]
        if not targets:
            raise KeyError(f"no replica on port {port}")
        return [await replica.update_faults(update) for replica in targets]

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
