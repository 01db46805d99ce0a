"""The Kubernetes API for InferencePool discovery, through the maintained `kubernetes_asyncio` client: connection
settings (in the cluster, a kubeconfig, or a named server), and the two collections a pool needs as `ListWatch`
ports (extproc/endpoints/inference_pool.py). Objects stay the API's JSON: no model classes on this path."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from extproc.endpoints.config import InferencePoolSource
from extproc.endpoints.inference_pool import Gone

__all__ = ["GROUP", "PLURAL", "VERSION", "KubernetesApi", "own_namespace"]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_LIST_TIMEOUT_S = 30.0


def own_namespace() -> str:
    """The namespace of this pod (its service account's), or `default` outside a cluster."""
    try:
        return (_SERVICE_ACCOUNT / "namespace").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


class KubernetesApi:
    """One client per watched pool; built on first use (loading a kubeconfig is asynchronous)."""

    def __init__(self, source: InferencePoolSource) -> None:
        self.source = source
        self.namespace = source.namespace or own_namespace()
        self._client: ApiClient | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> ApiClient:
        async with self._lock:
            if self._client is None:
                self._client = ApiClient(await self._configuration())
            return self._client

    async def _configuration(self) -> Configuration:
        source = self.source
        configuration = Configuration()
        if source.api_server is not None:
            configuration.host = source.api_server.rstrip("/")
            if source.ca_file is not None:
                configuration.ssl_ca_cert = source.ca_file
            if source.token_file is not None:
                token_file = Path(source.token_file)

                def refresh(conf: Configuration) -> None:  # bound tokens rotate: read the file on each call
                    conf.api_key["BearerToken"] = token_file.read_text(encoding="utf-8").strip()

                configuration.api_key["BearerToken"] = ""
                configuration.api_key_prefix["BearerToken"] = "Bearer"
                configuration.refresh_api_key_hook = refresh
        elif source.kubeconfig is not None:
            await kube_config.load_kube_config(config_file=source.kubeconfig, client_configuration=configuration)
        else:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration

    def pools(self, name: str) -> _Collection:
        return _Collection(self, "pools", {"field_selector": f"metadata.name={name}"})

    def pods(self, selector: tuple[tuple[str, str], ...]) -> _Collection:
        return _Collection(self, "pods", {"label_selector": ",".join(f"{k}={v}" for k, v in selector)})

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class _Collection:
    def __init__(self, api: KubernetesApi, kind: str, selectors: dict[str, str]) -> None:
        self._api = api
        self._kind = kind
        self._selectors = selectors

    async def _call(self) -> tuple[Any, dict[str, Any]]:
        client = await self._api.client()
        namespace = self._api.namespace
        if self._kind == "pods":
            return CoreV1Api(client).list_namespaced_pod, {"namespace": namespace, **self._selectors}
        return CustomObjectsApi(client).list_namespaced_custom_object, {
            "group": GROUP, "version": VERSION, "namespace": namespace, "plural": PLURAL, **self._selectors}

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        function, arguments = await self._call()
        response = await function(**arguments, _preload_content=False, _request_timeout=_LIST_TIMEOUT_S)
        try:
            if response.status != 200:
                raise RuntimeError(f"listing {self._kind} answered HTTP {response.status}: "
                                   f"{(await response.text())[:200]}")
            document = await response.json(content_type=None)
        finally:
            response.release()
        if not isinstance(document, dict) or not isinstance(document.get("items"), list):
            raise RuntimeError(f"listing {self._kind}: not a Kubernetes list")
        version = str((document.get("metadata") or {}).get("resourceVersion") or "")
        return [item for item in document["items"] if isinstance(item, dict)], version

    async def watch(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        function, arguments = await self._call()
        timeout_s = self._api.source.watch_timeout_s
        stream = Watch(return_type="object")
        try:
            # The server ends the watch after timeout_s; the client gives up on a connection silent for longer
            # (bookmarks arrive about every minute on a quiet collection).
            events = stream.stream(function, **arguments, resource_version=resource_version,
                                   allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                                   _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=timeout_s + 30))
            async for event in events:
                if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
                    raise RuntimeError(f"watching {self._kind}: not a watch event: {str(event)[:200]}")
                yield str(event.get("type")), event["raw_object"]
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc.reason)) from exc
            raise
        except TimeoutError:
            return  # a silent connection: watch again from the last version
        finally:
            await stream.close()
