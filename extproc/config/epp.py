"""Policy models of endpoint-picker mode (the Gateway API Inference Extension protocol), of InferencePool
discovery and of TLS on the gRPC port.

In endpoint-picker mode (`mode: endpoint-picker`) the gateway in front of us (Istio, kgateway, Envoy AI Gateway,
GKE) has already chosen the pool through an HTTPRoute to an `InferencePool`; we pick the endpoint inside it and
answer as the protocol says (header and `envoy.lb` dynamic metadata, 503 / 429). The decision pipeline is the
one of policy mode; only the adapter (extproc/server) and the scheduling stage's answer differ.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from extproc.config.schema import Policy

__all__ = ["DESTINATION_ENDPOINT", "DESTINATION_ENDPOINT_SERVED", "DESTINATION_ENDPOINT_SUBSET",
           "EndpointPickerConfig", "GrpcTls", "InferencePoolSource", "endpoint_picker_problems"]

# The protocol's keys (gateway-api-inference-extension, docs/proposals/004-endpoint-picker-protocol): the pick
# as a request header and as a dynamic-metadata key; the subset hint and the served endpoint as metadata keys.
DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
DESTINATION_ENDPOINT_SUBSET = "x-gateway-destination-endpoint-subset"
DESTINATION_ENDPOINT_SERVED = "x-gateway-destination-endpoint-served"

# Kubernetes object names: DNS-1123 subdomain (an InferencePool) and label (a namespace).
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9._-]{1,128}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _absolute(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path")
    return value


class EndpointPickerConfig(_Strict):
    """How the service answers in endpoint-picker mode (README "Endpoint-picker mode")."""

    # Answer exactly one ip:port, no fallbacks: for data planes that route by an ORIGINAL_DST cluster reading
    # the header (Envoy AI Gateway), which accepts one address only.
    single_endpoint: bool = False
    # Dynamic-metadata namespaces of the protocol: where the pick (and the served endpoint) go, and where the
    # data plane puts the subset hint. The protocol's defaults; change them only with the data plane's.
    metadata_namespace: str = Field(default="envoy.lb", pattern=_NAMESPACE.pattern)
    subset_namespace: str = Field(default="envoy.lb.subset_hint", pattern=_NAMESPACE.pattern)
    # Where an exchange's outcome (status, serving endpoint) comes from for passive health and in-flight
    # accounting: `response` = the response headers and the `x-gateway-destination-endpoint-served` metadata
    # the data plane forwards (no access log needed: the gateways of the protocol install none of ours);
    # `access-log` = our gRPC access log, when the data plane sends it (then the response is not read, so
    # nothing is counted twice).
    outcomes: Literal["response", "access-log"] = "response"
    # Flow control sheds with this status in this mode (the protocol's 429; a class's reject_status is not used).
    shed_status: Literal[429, 503] = 429


class InferencePoolSource(_Strict):
    """A pool's endpoints from a watched `InferencePool` (inference.networking.k8s.io/v1) and its ready pods:
    `podIP:port` for every one of the pool's `targetPorts`, for every pod its selector matches that is Ready."""

    name: str = Field(min_length=1, max_length=253)
    # "" = the namespace of the service's own pod (its service account's namespace file), else `default`.
    namespace: str = Field(default="", max_length=63)
    # The Kubernetes API: in the cluster by default (service account token and CA); `kubeconfig` for a
    # service run outside; `api_server` names the server directly (with `token_file` / `ca_file` if it needs
    # them; http:// only for tests and local proxies such as `kubectl proxy`).
    api_server: str | None = None
    kubeconfig: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    # A failed list or watch is retried after a delay doubling from backoff_initial_s up to backoff_max_s
    # (with jitter); a watch is re-opened after watch_timeout_s (the API server's own bound on a watch).
    backoff_initial_s: float = Field(default=0.5, gt=0, le=60)
    backoff_max_s: float = Field(default=30.0, gt=0, le=600)
    watch_timeout_s: int = Field(default=300, ge=10, le=3600)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _SUBDOMAIN.match(value):
            raise ValueError(f"InferencePool name {value!r} is not a Kubernetes object name")
        return value

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, value: str) -> str:
        if value and not _LABEL.match(value):
            raise ValueError(f"namespace {value!r} is not a Kubernetes namespace name")
        return value

    @field_validator("kubeconfig", "token_file", "ca_file")
    @classmethod
    def _absolute_paths(cls, value: str | None) -> str | None:
        return _absolute(value)

    @field_validator("api_server")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("https://", "http://")):
            raise ValueError(f"api_server {value!r} must be an https:// (or http://) URL")
        return value


class GrpcTls(_Strict):
    """TLS on the gRPC port (ext_proc, access log, health): a PEM certificate chain and key, read at start and
    again whenever either file changes (checked every `reload_interval_s`; new connections get the new pair)."""

    cert_file: str
    key_file: str
    reload_interval_s: float = Field(default=5.0, ge=0.5, le=3600)

    @field_validator("cert_file", "key_file")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        checked = _absolute(value)
        assert checked is not None
        return checked


def endpoint_picker_problems(policy: Policy) -> list[str]:
    """What endpoint-picker mode cannot do with this policy (empty in policy mode)."""
    problems: list[str] = []
    if policy.envoy.request_body_mode != "buffered" and policy.mode != "endpoint-picker":
        problems.append("envoy.request_body_mode streamed / full-duplex needs mode: endpoint-picker (policy mode "
                        "turns response headers on per request, which only a buffered body allows)")
    if policy.mode != "endpoint-picker":
        return problems
    if len(policy.pools) != 1:
        problems.append(f"mode endpoint-picker serves one pool per process (the InferencePool the gateway "
                        f"chose); the policy has {len(policy.pools)}")
    for pool in policy.pools:
        if pool.backup_pool is not None:
            problems.append(f"pool {pool.name!r}: backup_pool cannot apply in endpoint-picker mode (the gateway "
                            f"picks the pool)")
    if policy.rollout.splits:
        problems.append("rollout.splits choose between pools: in endpoint-picker mode the gateway does (HTTPRoute "
                        "weights over InferencePools)")
    return problems
