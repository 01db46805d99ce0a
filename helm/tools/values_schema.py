"""Write (or, with --check, verify) helm/values.schema.json: the chart's values, strict (`additionalProperties:
false` everywhere the chart defines the keys, so a typo fails `helm install` instead of being ignored), with
`policy` generated from the policy model itself (extproc/config/schema.py), so the chart and the service agree.

Kubernetes passthrough values (resources, securityContext, affinity, ...) stay open objects: the API server
checks them. Run by `make helm-schema`; tests/helm/test_values_schema.py fails when the file is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA = HERE.parent / "values.schema.json"

STRING = {"type": "string"}
BOOL = {"type": "boolean"}
OPEN = {"type": "object"}  # a Kubernetes object the API server validates
LIST_OF_OBJECTS = {"type": "array", "items": {"type": "object"}}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
PORT_OR_ZERO = {"type": "integer", "minimum": 0, "maximum": 65535}
PULL = {"enum": ["Always", "IfNotPresent", "Never"]}


def strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def image(required: bool = True) -> dict[str, Any]:
    return strict({"repository": {"type": "string", "minLength": 1}, "tag": STRING, "pullPolicy": PULL},
                  ("repository",) if required else ())


def probe() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 1}
    return strict({"periodSeconds": count, "failureThreshold": count, "timeoutSeconds": count,
                   "initialDelaySeconds": {"type": "integer", "minimum": 0}, "successThreshold": count})


def token() -> dict[str, Any]:
    return strict({"token": STRING, "existingSecret": STRING, "existingSecretKey": {"type": "string", "minLength": 1}})


def chart_values() -> dict[str, Any]:
    return {
        "global": OPEN,
        "mode": {"enum": ["istio-gateway", "istio-sidecar", "standalone", "epp"]},
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "commonLabels": LABELS,
        "clusterDomain": {"type": "string", "minLength": 1},
        "image": image(),
        "imagePullSecrets": LIST_OF_OBJECTS,
        "replicaCount": {"type": "integer", "minimum": 0},
        "policy": {"$ref": "#/$defs/Policy"},
        "tenants": strict({"existingSecret": STRING, "data": LABELS, "keysFile": {"type": "string", "minLength": 1},
                           "mountPath": {"type": "string", "pattern": "^/"}}),
        "redis": strict({
            "enabled": BOOL, "url": {"type": "string", "pattern": "^$|^(rediss?|unix)://"}, "existingSecret": STRING,
            "existingSecretKey": {"type": "string", "minLength": 1}, "image": image(), "port": PORT,
            "maxmemory": STRING, "resources": OPEN}),
        "serviceAccount": strict({"create": BOOL, "name": STRING, "annotations": LABELS, "automountToken": BOOL}),
        "podAnnotations": LABELS,
        "podLabels": LABELS,
        "podSecurityContext": OPEN,
        "securityContext": OPEN,
        "resources": OPEN,
        "env": LIST_OF_OBJECTS,
        "drainGraceSeconds": {"type": "number", "minimum": 0},
        "preStopSleepSeconds": {"type": "integer", "minimum": 0},
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
        "probes": strict({"grpc": BOOL, "startup": probe(), "readiness": probe(), "liveness": probe()}),
        "service": strict({"type": {"enum": ["ClusterIP"]}, "annotations": LABELS, "exposeAdmin": BOOL}),
        "grpcAuth": token(),
        "adminAuth": token(),
        "networkPolicy": strict({"enabled": BOOL, "grpcFrom": LIST_OF_OBJECTS, "envoyNamespace": STRING,
                                 "adminFrom": LIST_OF_OBJECTS, "listenerFrom": LIST_OF_OBJECTS}),
        "podDisruptionBudget": strict({"enabled": BOOL, "minAvailable": {"type": ["integer", "string"]},
                                       "maxUnavailable": {"type": ["integer", "string"]}}),
        "autoscaling": strict({"enabled": BOOL, "minReplicas": {"type": "integer", "minimum": 1},
                               "maxReplicas": {"type": "integer", "minimum": 1},
                               "targetCPUUtilizationPercentage": {"type": "integer", "minimum": 1, "maximum": 100},
                               "behavior": OPEN}),
        "keda": strict({
            "enabled": BOOL, "triggerType": {"enum": ["external-push", "external"]}, "scalerAddress": STRING,
            "pollingInterval": {"type": "integer", "minimum": 1}, "cooldownPeriod": {"type": "integer", "minimum": 0},
            "pools": {"type": "array", "items": strict({
                "pool": {"type": "string", "minLength": 1},
                "scaleTargetRef": {"type": "object", "required": ["name"]},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
            }, ("pool", "scaleTargetRef"))},
            "tls": strict({"secretName": STRING, "clientSecretName": STRING}),
            "grpcPort": {"type": "integer", "minimum": 1, "maximum": 65535},
            "from": LIST_OF_OBJECTS,
            "allowUnauthenticated": BOOL,
        }),
        "serviceMonitor": strict({"enabled": BOOL, "interval": STRING, "scrapeTimeout": STRING, "labels": LABELS}),
        "dashboards": strict({"enabled": BOOL, "namespace": STRING, "labels": LABELS, "annotations": LABELS}),
        "nodeSelector": LABELS,
        "tolerations": LIST_OF_OBJECTS,
        "affinity": OPEN,
        "topologySpreadConstraints": LIST_OF_OBJECTS,
        "priorityClassName": STRING,
        "istio": strict({
            "gatewaySelector": LABELS,
            "envoyFilterNamespace": STRING,
            "priority": {"type": "integer"},
            "listenerPort": PORT_OR_ZERO,
            "sidecar": strict({"workloadSelector": LABELS, "port": PORT_OR_ZERO}),
            "extprocCluster": strict({"mode": {"enum": ["istio", "dedicated"]}, "name": STRING}),
            "usageMetadata": strict({"json": BOOL, "sse": BOOL}),
            "requestTimeouts": BOOL,
            "earlyHeaderMutation": BOOL,
            "accessLog": BOOL,
            "tracing": BOOL,
            "patchBufferLimit": BOOL,
            "routing": strict({
                "poolClusters": {"enum": ["mesh", "dedicated", "none"]},
                "poolServices": {"type": "object", "additionalProperties": {
                    "type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$"}},
                "routeName": STRING,
                "timeout": STRING,
                "survivesServiceFailure": BOOL,
                "fallbackMatch": {"type": "object", "minProperties": 1},
            }),
        }),
        "epp": strict({
            "pool": STRING,
            "inferencePool": strict({
                "create": BOOL,
                "name": {"type": "string", "pattern": "^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
                "selector": {**LABELS, "maxProperties": 64},
                "targetPorts": {"type": "array", "items": PORT, "minItems": 1, "maxItems": 8, "uniqueItems": True},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "failureMode": {"enum": ["FailClose", "FailOpen"]},
            }),
            "tls": strict({"secretName": STRING}),
            "rbac": strict({"create": BOOL}),
        }),
        "standalone": strict({
            "envoy": strict({"image": image(), "logLevel": {"enum": ["trace", "debug", "info", "warning", "warn",
                                                                     "error", "critical", "off"]},
                             "resources": OPEN, "securityContext": OPEN,
                             "preStopSleepSeconds": {"type": "integer", "minimum": 0}}),
            "service": strict({"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}, "port": PORT,
                               "annotations": LABELS}),
        }),
    }


def schema() -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parents[1]))
    from extproc.config import Policy
    from extproc.policy_types import NAME_PATTERN

    policy = Policy.model_json_schema()
    definitions = policy.pop("$defs")
    definitions["Policy"] = policy
    # What the model checks in validators rather than field types, where a schema can say it too.
    pool = definitions["PoolConfig"]
    pool["properties"]["name"]["pattern"] = NAME_PATTERN.pattern
    sources = ("endpoints", "discovery", "inference_pool")
    pool["not"] = {"anyOf": [{"required": [a, b]} for i, a in enumerate(sources) for b in sources[i + 1:]]}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "extproc chart values",
        "description": "Generated by helm/tools/values_schema.py; `policy` is the service's own policy schema.",
        **strict(chart_values(), ("mode", "image", "policy")),
        # Outside epp mode (where the InferencePool is the source) a pool names its endpoints' source.
        "if": {"properties": {"mode": {"const": "epp"}}, "required": ["mode"]},
        "else": {"properties": {"policy": {"properties": {"pools": {"items": {
            "anyOf": [{"required": [source]} for source in sources]}}}}}},
        "$defs": dict(sorted(definitions.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args(argv)
    text = json.dumps(schema(), indent=1, sort_keys=False) + "\n"
    if args.check:
        if SCHEMA.read_text(encoding="utf-8") != text:
            print(f"{SCHEMA} is stale: run `make helm-schema` and commit it", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
