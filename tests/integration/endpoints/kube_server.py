"""A stand-in for the Kubernetes API server (none runs here) that speaks its list/watch protocol for pods and
InferencePools: lists carry the collection's resourceVersion; `?watch=true` streams one JSON event per line over
a chunked response (ADDED / MODIFIED / DELETED, BOOKMARK when asked for with allowWatchBookmarks, and an ERROR
event with a 410 Status for a version older than the kept history); label and field selectors; bearer tokens.
Objects have the API's real JSON shapes (pod status conditions, InferencePool v1 spec)."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

POOLS_PATH = "/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools"
PODS_PATH = "/api/v1/namespaces/{namespace}/pods"


def pod(name: str, ip: str, labels: dict[str, str], *, ready: bool = True, namespace: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": dict(labels),
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                 "ports": [{"containerPort": 8000, "protocol": "TCP"}]}], "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.128.0.2",
                   "conditions": [
                       {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                       {"type": "Ready", "status": "True" if ready else "False",
                        "lastTransitionTime": "2026-01-01T00:00:09Z"},
                       {"type": "ContainersReady", "status": "True" if ready else "False",
                        "lastTransitionTime": "2026-01-01T00:00:09Z"}]},
    }


def inference_pool(name: str, labels: dict[str, str], ports: list[int], namespace: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": {"selector": {"matchLabels": dict(labels)}, "targetPorts": [{"number": p} for p in ports],
                 "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}, "kind": "Service",
                                       "group": "", "failureMode": "FailClose"}},
    }


def _matches(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    metadata = obj["metadata"]
    for clause in filter(None, (labels or "").split(",")):
        key, _, value = clause.partition("=")
        if metadata.get("labels", {}).get(key) != value:
            return False
    for clause in filter(None, (fields or "").split(",")):
        key, _, value = clause.partition("=")
        if key == "metadata.name" and metadata["name"] != value:
            return False
    return True


@dataclass
class Watcher:
    kind: str
    labels: str | None
    fields: str | None
    bookmarks: bool
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


class KubeApiServer:
    def __init__(self, namespace: str = "llm", token: str | None = None) -> None:
        self.namespace = namespace
        self.token = token
        self.version = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"pods": {}, "inferencepools": {}}
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, kind, event)
        self.kept_from = 0  # watches from an older version get 410
        self.watchers: list[Watcher] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (kind, "list"|"watch", query)
        self.failures: dict[str, list[int]] = {"pods": [], "inferencepools": []}  # next answers, per collection
        self.watch_gate = asyncio.Event()  # cleared: new watches wait (a slow reconnect) until it is set
        self.watch_gate.set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(POOLS_PATH.format(namespace="{namespace}"), self._collection("inferencepools"))
        app.router.add_get(PODS_PATH.format(namespace="{namespace}"), self._collection("pods"))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- changes, as a controller or the kubelet makes them
    def put(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        name = obj["metadata"]["name"]
        kind_of_event = "MODIFIED" if name in self.objects[kind] else "ADDED"
        self.objects[kind][name] = obj
        self._emit(kind, {"type": kind_of_event, "object": obj})

    def delete(self, kind: str, name: str) -> None:
        self.version += 1
        obj = copy.deepcopy(self.objects[kind].pop(name))
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._emit(kind, {"type": "DELETED", "object": obj})

    def _emit(self, kind: str, event: dict[str, Any]) -> None:
        self.history.append((self.version, kind, event))
        for watcher in self.watchers:
            if watcher.kind == kind and _matches(event["object"], watcher.labels, watcher.fields):
                watcher.queue.put_nowait(event)

    def bookmark(self) -> None:
        """A BOOKMARK to every watch that asked for them: the current version, no object change."""
        for watcher in self.watchers:
            if watcher.bookmarks:
                watcher.queue.put_nowait({"type": "BOOKMARK", "object": {
                    "kind": "Pod" if watcher.kind == "pods" else "InferencePool",
                    "apiVersion": "v1" if watcher.kind == "pods" else "inference.networking.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.version),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})

    def compact(self) -> None:
        """Forget the history: a watch from any version before now gets 410 Gone."""
        self.kept_from = self.version
        self.history.clear()

    def end_watches(self) -> None:
        """The server ends every open watch (its timeout, or a restart)."""
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)

    def count(self, kind: str, verb: str) -> int:
        return sum(1 for k, v, _ in self.requests if (k, v) == (kind, verb))

    def last(self, kind: str, verb: str) -> dict[str, str]:
        return next(q for k, v, q in reversed(self.requests) if (k, v) == (kind, verb))

    # --- the HTTP side
    def _collection(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            query = dict(request.query)
            watching = query.get("watch", "").lower() in ("true", "1")
            self.requests.append((kind, "watch" if watching else "list", query))
            if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
                return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
            if self.failures[kind]:
                code = self.failures[kind].pop(0)
                return web.json_response(_status(code, "InternalError", "injected failure"), status=code)
            if request.match_info["namespace"] != self.namespace:
                return web.json_response({"kind": f"{kind}List", "apiVersion": "v1",
                                          "metadata": {"resourceVersion": str(self.version)}, "items": []})
            labels, fields = query.get("labelSelector"), query.get("fieldSelector")
            if not watching:
                items = [o for o in self.objects[kind].values() if _matches(o, labels, fields)]
                return web.json_response({"kind": "PodList" if kind == "pods" else "InferencePoolList",
                                          "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                                          "items": items})
            return await self._watch(request, kind, query, labels, fields)

        return handle

    async def _watch(self, request: web.Request, kind: str, query: dict[str, str], labels: str | None,
                     fields: str | None) -> web.StreamResponse:
        await self.watch_gate.wait()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        since = int(query.get("resourceVersion") or 0)
        if since < self.kept_from:
            expired = {"type": "ERROR", "object": _status(410, "Expired",
                                                          f"too old resource version: {since} ({self.kept_from})")}
            await response.write(json.dumps(expired).encode() + b"\n")
            return response
        watcher = Watcher(kind, labels, fields, query.get("allowWatchBookmarks", "").lower() in ("true", "1"))
        for version, event_kind, event in self.history:
            if version > since and event_kind == kind and _matches(event["object"], labels, fields):
                watcher.queue.put_nowait(event)
        self.watchers.append(watcher)
        try:
            while (event := await watcher.queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
        except ConnectionResetError:
            pass
        finally:
            self.watchers.remove(watcher)
        return response


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
