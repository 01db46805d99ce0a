"""Policy models of endpoint-picker mode (the Gateway API Inference Extension protocol) and of TLS on the gRPC
port (the `endpoint_picker` and `service.tls` sections; `pools[].inference_pool` is extproc/endpoints/config.py).

In endpoint-picker mode (`mode: endpoint-picker`) the gateway in front of us (Istio, kgateway, Envoy AI Gateway,
GKE) has already chosen the pool through an HTTPRoute to an `InferencePool`; we pick the endpoint inside it and
answer as the protocol says (header and `envoy.lb` dynamic metadata, 503 / 429). The decision pipeline is the
one of policy mode; only the adapter (extproc/server) and the scheduling stage's answer differ.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from extproc.policy_types import Strict

if TYPE_CHECKING:
    from extproc.config.schema import Policy

__all__ = ["DESTINATION_ENDPOINT", "DESTINATION_ENDPOINT_SERVED", "DESTINATION_ENDPOINT_SUBSET",
           "EndpointPickerConfig", "GrpcTls", "endpoint_picker_problems"]

# The protocol's keys (gateway-api-inference-extension, docs/proposals/004-endpoint-picker-protocol): the pick
# as a request header and as a dynamic-metadata key; the subset hint and the served endpoint as metadata keys.
DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
DESTINATION_ENDPOINT_SUBSET = "x-gateway-destination-endpoint-subset"
DESTINATION_ENDPOINT_SERVED = "x-gateway-destination-endpoint-served"

_NAMESPACE = re.compile(r"^[a-z0-9._-]{1,128}$")


class EndpointPickerConfig(Strict):
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


class GrpcTls(Strict):
    """TLS on the gRPC port (ext_proc, access log, health): a PEM certificate chain and key, read at start and
    again whenever either file changes (checked every `reload_interval_s`; new connections get the new pair)."""

    cert_file: str
    key_file: str
    reload_interval_s: float = Field(default=5.0, ge=0.5, le=3600)

    @field_validator("cert_file", "key_file")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        return value


def picker_body_mode(data: Any) -> Any:
    """The raw policy with envoy.request_body_mode's default: prebuffered in policy mode (the schema's: our rendered
    Envoy adds the buffer filter), buffered in endpoint-picker mode (the gateway's filter is its owner's)."""
    if not isinstance(data, dict) or data.get("mode") != "endpoint-picker":
        return data
    envoy = data.get("envoy", {})
    if isinstance(envoy, dict) and "request_body_mode" not in envoy:
        return {**data, "envoy": {**envoy, "request_body_mode": "buffered"}}
    return data


def endpoint_picker_problems(policy: Policy) -> list[str]:
    """What endpoint-picker mode cannot do with this policy (empty in policy mode)."""
    problems: list[str] = []
    if policy.envoy.request_body_mode == "full-duplex" and policy.mode != "endpoint-picker":
        problems.append("envoy.request_body_mode full-duplex needs mode: endpoint-picker (in policy mode a routed "
                        "exchange must outlive the service: Envoy stops failing open once a full-duplex body was "
                        "sent; use streamed)")
    if policy.mode != "endpoint-picker":
        return problems
    if policy.envoy.request_body_mode == "prebuffered":
        problems.append("envoy.request_body_mode prebuffered is policy mode's (our rendered Envoy adds the buffer "
                        "filter); in endpoint-picker mode the gateway's ext_proc filter is configured by its owner")
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
