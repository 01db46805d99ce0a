"""InferencePool discovery through the real `kubernetes_asyncio` client against an HTTP server speaking the
Kubernetes list/watch protocol (tests/integration/endpoints/kube_server.py): the pool's ready pods become
endpoints, watch events move them, bookmarks advance the version, 410 Gone lists again, failures back off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from extproc.config.schema import PoolConfig
from extproc.endpoints.config import InferencePoolSource
from extproc.endpoints.inference_pool import InferencePoolDiscovery
from extproc.endpoints.kube import KubernetesApi
from tests.integration.endpoints.kube_server import KubeApiServer, inference_pool, pod
from tests.support import eventually

pytestmark = pytest.mark.asyncio

LABELS = {"app": "vllm-llama"}


async def until(check: Callable[[], object], what: str) -> None:
    await eventually(check, what, timeout_s=10.0)  # a bound for a loaded machine


class Found:
    """What discovery published, per pool, in order."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, pool: str, addresses: tuple[str, ...]) -> None:
        self.sets.append((pool, addresses))

    @property
    def last(self) -> tuple[str, ...] | None:
        return self.sets[-1][1] if self.sets else None


@pytest.fixture
async def server() -> AsyncIterator[KubeApiServer]:
    api = KubeApiServer(token="sa-token")
    await api.start()
    yield api
    await api.stop()


def pool_config(server: KubeApiServer, token_file: Path, **extra: object) -> PoolConfig:
    source = {"name": "llama", "namespace": "llm", "api_server": server.url, "token_file": str(token_file),
              "backoff_initial_s": 0.5, "backoff_max_s": 4, **extra}
    return PoolConfig(name="llama", model="m", inference_pool=InferencePoolSource(**source))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("sa-token\n")
    return path


async def test_ready_pods_on_every_target_port_become_the_pool_and_follow_watch_events(
        server: KubeApiServer, token_file: Path) -> None:
    server.put("inferencepools", inference_pool("llama", LABELS, [8000, 8001]))
    server.put("inferencepools", inference_pool("other", {"app": "other"}, [9000]))
    server.put("pods", pod("a", "10.1.0.1", LABELS))
    server.put("pods", pod("b", "10.1.0.2", LABELS, ready=False))  # not Ready: not an endpoint
    server.put("pods", pod("c", "10.1.0.3", {"app": "other"}))  # another pool's
    found = Found()
    discovery = InferencePoolDiscovery(found, KubernetesApi)
    discovery.configure([pool_config(server, token_file)])
    try:
        await until(lambda: found.last == ("10.1.0.1:8000", "10.1.0.1:8001"), "the first pod on both ports")
        assert discovery.synced
        assert server.last("pods", "list")["labelSelector"] == "app=vllm-llama"
        assert server.last("inferencepools", "list")["fieldSelector"] == "metadata.name=llama"
        server.put("pods", pod("b", "10.1.0.2", LABELS, ready=True))  # the kubelet marks it Ready
        await until(lambda: found.last is not None and "10.1.0.2:8000" in found.last, "pod b ready")
        terminating = pod("a", "10.1.0.1", LABELS)
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z"
        server.put("pods", terminating)
        await until(lambda: found.last == ("10.1.0.2:8000", "10.1.0.2:8001"), "pod a terminating")
        server.delete("pods", "b")
        await until(lambda: found.last == (), "every pod gone")
        # A new selector and port: the pods are watched again with it.
        server.put("pods", pod("c2", "10.1.0.4", {"app": "other"}))
        server.put("inferencepools", inference_pool("llama", {"app": "other"}, [9000]))
        await until(lambda: found.last == ("10.1.0.3:9000", "10.1.0.4:9000"), "the new selector's pods")
        assert all(pool == "llama" for pool, _ in found.sets)
    finally:
        await discovery.stop()


async def test_a_bookmark_advances_the_version_a_closed_watch_resumes_and_410_lists_again(
        server: KubeApiServer, token_file: Path) -> None:
    server.put("inferencepools", inference_pool("llama", LABELS, [8000]))
    server.put("pods", pod("a", "10.1.0.1", LABELS))
    found = Found()
    discovery = InferencePoolDiscovery(found, KubernetesApi)
    discovery.configure([pool_config(server, token_file)])
    try:
        await until(lambda: found.last == ("10.1.0.1:8000",), "the first list")
        await until(lambda: server.count("pods", "watch") == 1, "the pods watch")
        assert server.last("pods", "watch")["allowWatchBookmarks"].lower() == "true"
        # Unrelated changes move the version on; a bookmark tells the watcher where it stands.
        for index in range(3):
            server.put("pods", pod(f"x{index}", f"10.9.0.{index}", {"app": "unrelated"}))
        server.bookmark()
        bookmarked = str(server.version)
        await until(lambda: discovery.watches()["llama"]._pods is not None
                    and discovery.watches()["llama"]._pods.resource_version == bookmarked, "the bookmark's version")
        server.end_watches()  # the server's timeout: the watch resumes from the bookmark, no new list
        await until(lambda: server.count("pods", "watch") == 2, "the pods watch again")
        assert server.last("pods", "watch")["resourceVersion"] == bookmarked
        assert server.count("pods", "list") == 1
        # While the watcher reconnects, a pod goes away and the history is compacted: the resumed watch gets 410,
        # and the list that follows sees the deletion no event told of.
        server.watch_gate.clear()
        server.end_watches()
        await until(lambda: server.count("pods", "watch") == 3, "the watcher reconnecting")
        server.delete("pods", "a")
        server.put("pods", pod("b", "10.1.0.2", LABELS))
        server.compact()
        server.watch_gate.set()
        await until(lambda: server.count("pods", "list") == 2, "a new list after 410 Gone")
        await until(lambda: found.last == ("10.1.0.2:8000",), "the state after the gap")
        await until(lambda: server.count("pods", "watch") >= 4, "watching again from the new list")
        assert server.last("pods", "watch")["resourceVersion"] == str(server.version)
    finally:
        await discovery.stop()


async def test_failures_back_off_doubling_to_the_bound_and_keep_the_last_endpoints(
        server: KubeApiServer, token_file: Path) -> None:
    server.put("inferencepools", inference_pool("llama", LABELS, [8000]))
    server.put("pods", pod("a", "10.1.0.1", LABELS))
    found = Found()
    delays: list[float] = []
    resume = asyncio.Event()

    async def sleep(seconds: float) -> None:  # backoff delays recorded; no time passes
        delays.append(seconds)
        if len(delays) >= 6:
            await resume.wait()

    discovery = InferencePoolDiscovery(found, KubernetesApi, sleep=sleep)
    discovery.configure([pool_config(server, token_file)])
    try:
        await until(lambda: found.last == ("10.1.0.1:8000",), "the first list")
        await until(lambda: server.count("pods", "watch") == 1, "the pods watch")
        server.failures["pods"] = [500] * 6
        for watcher in server.watchers:  # the pods watch ends; the pool's stays open
            if watcher.kind == "pods":
                watcher.queue.put_nowait(None)
        await until(lambda: len(delays) == 6, "six retries")
        # Doubling from 0.5 s to the 4 s bound, each drawn within [half, whole] of its step.
        for delay, step in zip(delays, [0.5, 1, 2, 4, 4, 4], strict=True):
            assert step / 2 <= delay <= step
        assert found.last == ("10.1.0.1:8000",)  # an unreachable API keeps the last good set
        resume.set()
        pods = discovery.watches()["llama"]._pods
        assert pods is not None and pods.failures_total == 6
        await until(lambda: pods.lists_total == 2, "listing again once the server answers")
        server.put("pods", pod("b", "10.1.0.2", LABELS))
        await until(lambda: found.last == ("10.1.0.1:8000", "10.1.0.2:8000"), "events after recovery")
    finally:
        await discovery.stop()


async def test_a_wrong_token_is_refused_and_retried_never_served_as_empty(server: KubeApiServer,
                                                                         tmp_path: Path) -> None:
    server.put("inferencepools", inference_pool("llama", LABELS, [8000]))
    server.put("pods", pod("a", "10.1.0.1", LABELS))
    token = tmp_path / "token"
    token.write_text("stale")
    found = Found()
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    discovery = InferencePoolDiscovery(found, KubernetesApi, sleep=sleep)
    discovery.configure([pool_config(server, token)])
    try:
        await until(lambda: len(delays) >= 2, "retries of the refused list")
        assert found.sets == [] and not discovery.synced
        token.write_text("sa-token")  # the kubelet rotated the projected token: the file is read again
        await until(lambda: found.last == ("10.1.0.1:8000",), "listing with the new token")
        assert discovery.synced
    finally:
        await discovery.stop()
