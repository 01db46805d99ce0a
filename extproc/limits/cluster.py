"""`ClusterClient`: the limits store's Redis client for a Redis Cluster. Each command goes to the primary
that serves its key's slot, over one pipelined `RespClient` per primary (`extproc.limits.resp`).

- The slot map comes from CLUSTER SLOTS, asked of a known node (the seed first): at connect, and again
  (at most every `_REFRESH_S`) after a MOVED reply or a node that cannot be reached (a primary that
  failed over: its replica serves the slots once promoted, and the next map says so).
- MOVED: the command goes again to the node the reply names, which serves the slot from then on. ASK (a
  slot being migrated): again to that node, this once, after ASKING. Posted commands are sent again the
  same way; their replies still reach their callbacks.
- Every key of one command must be in one slot (a hash tag); keyless commands (PING) go to every node,
  so `call("PING")` still waits for every command posted before it. While a slot migrates, Redis runs
  no script whose keys are not all on one node (TRYAGAIN: `StoreTimeout`, decided by the policy).
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from extproc.limits.redis_address import Address, RedisTls
from extproc.limits.resp import Arg, Posted, Redirected, RespClient, Script, ScriptCall
from extproc.limits.types import StoreUnavailable

__all__ = ["ClusterClient", "RedisClient", "hash_tag", "key_slot", "redis_client"]

_log = logging.getLogger(__name__)
_SLOTS = 16384
_MAX_REDIRECTS = 3
_REFRESH_S = 0.25


def hash_tag(key: str) -> str | None:
    """The hash tag of `key` (text between the first "{" and the next "}", not empty), if any."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1:end] if end > start + 1 else None


def key_slot(key: Arg) -> int:
    """The cluster slot of `key`: CRC16 of its hash tag, else of the whole key."""
    text = key.decode() if isinstance(key, bytes) else str(key)
    return binascii.crc_hqx((hash_tag(text) or text).encode(), 0) % _SLOTS


class ClusterClient:
    def __init__(self, seed: Address, *, timeout_s: float, scripts: Sequence[Script] = (),
                 on_posted_failure: Callable[[str, str], None] | None = None) -> None:
        if seed.db:
            raise ValueError("a Redis Cluster has only database 0")
        self._seed, self._timeout_s, self._scripts = seed, timeout_s, tuple(scripts)
        self._on_posted_failure = on_posted_failure
        self._nodes: dict[tuple[str, int], RespClient] = {}
        self._slots: list[tuple[str, int] | None] = [None] * _SLOTS
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = float("-inf")

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    async def call(self, *args: Arg) -> Any:
        """A command on its key's node (`args[1]`), or, without a key (PING), on every node."""
        if len(args) > 1:
            return await self._routed(args[1], lambda node: node.call(*args))
        replies = await asyncio.gather(*(node.call(*args) for node in self._primaries()))
        return replies[0] if replies else None

    async def call_at(self, key: Arg, *args: Arg) -> Any:
        """A command on `key`'s node, for commands whose key is not their first argument (XREAD)."""
        return await self._routed(key, lambda node: node.call(*args))

    async def evalsha(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                      timeout_s: float | None = None) -> Any:
        return await self._routed(keys[0], lambda node: node.evalsha(script, keys, args, timeout_s))

    async def evalsha_batch(self, calls: Sequence[ScriptCall], timeout_s: float | None = None) -> list[Any]:
        """`RespClient.evalsha_batch`, but each call on its first key's node, concurrently (keys of different
        slots may live on different nodes): per call its reply or the `StoreUnavailable` it failed with."""
        async def one(script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
            try:
                return await self.evalsha(script, keys, args, timeout_s)
            except StoreUnavailable as exc:
                return exc

        return list(await asyncio.gather(*(one(*call) for call in calls)))

    async def post(self, op: str, *args: Arg) -> None:
        await self._node_for(args[1]).post(op, *args)

    async def post_evalsha(self, op: str, script: Script, keys: Sequence[Arg], args: Sequence[Arg],
                           on_reply: Callable[[Any], None] | None = None) -> None:
        await self._node_for(keys[0]).post_evalsha(op, script, keys, args, on_reply)

    async def connect(self) -> None:
        """Learn the slot map and connect to every primary (which loads the scripts there)."""
        await self._learn_slots()
        await asyncio.gather(*(node.connect() for node in self._primaries()))

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in self._nodes.values()))

    # --- routing --------------------------------------------------------------------------------

    def _node(self, host: str, port: int) -> RespClient:
        node = self._nodes.get((host, port))
        if node is None:
            address = dataclasses.replace(self._seed, host=host, port=port)  # same credentials and TLS
            node = self._nodes[(host, port)] = RespClient(address, timeout_s=self._timeout_s, scripts=self._scripts,
                                                          on_posted_failure=self._on_posted_failure,
                                                          on_redirect=self._posted_redirect)
        return node

    def _primaries(self) -> list[RespClient]:
        return [self._node(*address) for address in {a for a in self._slots if a is not None}]

    def _node_for(self, key: Arg) -> RespClient:
        owner = self._slots[key_slot(key)] or (self._seed.host, self._seed.port)  # unknown: it will redirect
        return self._node(*owner)

    async def _routed(self, key: Arg, send: Callable[[RespClient], Any]) -> Any:
        node = self._node_for(key)
        for _ in range(_MAX_REDIRECTS):
            try:
                return await send(node)
            except Redirected as redirect:
                node = self._redirected(redirect)
                if redirect.ask:
                    await node.post("asking", "ASKING")  # written just before the command, same connection
            except StoreUnavailable:
                self._stale()
                raise
        raise StoreUnavailable(f"redis cluster: more than {_MAX_REDIRECTS} redirections for one command")

    def _redirected(self, redirect: Redirected) -> RespClient:
        if not redirect.ask:
            self._slots[redirect.slot] = (redirect.host, redirect.port)
            self._stale()
        return self._node(redirect.host, redirect.port)

    def _posted_redirect(self, posted: Posted, message: str) -> None:
        redirect = Redirected(message)
        node = self._redirected(redirect)
        task = asyncio.get_running_loop().create_task(node.repost(posted, asking=redirect.ask))
        task.add_done_callback(lambda done: done.exception() if not done.cancelled() else None)

    # --- the slot map ---------------------------------------------------------------------------

    def _stale(self) -> None:
        """Ask for the slot map again in the background (at most every _REFRESH_S)."""
        loop = asyncio.get_running_loop()
        if self._refresh is None and loop.time() - self._refreshed_at >= _REFRESH_S:
            self._refreshed_at = loop.time()
            self._refresh = loop.create_task(self._learn_slots())
            self._refresh.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task[None]) -> None:
        self._refresh = None
        if not task.cancelled() and task.exception() is not None:
            _log.warning("redis cluster: no node answered CLUSTER SLOTS: %s", task.exception())

    async def _learn_slots(self) -> None:
        seed = (self._seed.host, self._seed.port)
        candidates = [seed, *(address for address in self._nodes if address != seed)]
        failure: StoreUnavailable | None = None
        for host, port in candidates:
            try:
                ranges = await self._node(host, port).call("CLUSTER", "SLOTS")
            except StoreUnavailable as exc:
                failure = exc
                continue
            for start, end, primary, *_ in ranges:
                served_by = (primary[0].decode() or host, int(primary[1]))  # "" : the node asked
                self._node(*served_by)
                self._slots[int(start):int(end) + 1] = [served_by] * (int(end) - int(start) + 1)
            return
        raise failure or StoreUnavailable("redis cluster: no node known")


def redis_client(url: str, *, cluster: bool, timeout_s: float, scripts: Sequence[Script] = (),
                 on_posted_failure: Callable[[str, str], None] | None = None,
                 tls: RedisTls | None = None) -> RespClient | ClusterClient:
    """The client of a Redis (`cluster`: of a Redis Cluster, `url` naming any of its nodes); `tls` configures a
    rediss:// URL. Every Redis connection of the service is made here."""
    address = Address.from_url(url, tls)
    if cluster:
        return ClusterClient(address, timeout_s=timeout_s, scripts=scripts, on_posted_failure=on_posted_failure)
    return RespClient(address, timeout_s=timeout_s, scripts=scripts, on_posted_failure=on_posted_failure)


RedisClient = RespClient | ClusterClient  # what the limits store and the replicas' exchanges talk through
