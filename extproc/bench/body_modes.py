"""`extproc bench overhead --body-modes`: the service in endpoint-picker mode behind an Envoy shaped like Istio's
InferencePool support (extproc/xds/picker.py), one service and Envoy per request body mode the gateway's ext_proc
filter may use (buffered, streamed, full-duplex), compared in the same run."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from extproc.xds.picker import BODY_MODES, POOL_CLUSTER

if TYPE_CHECKING:
    from extproc.config import Policy

__all__ = ["add_body_modes", "over_buffered", "parse_modes", "picker_policy", "pool_cluster"]


def add_body_modes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--body-modes", default="",
                        help="endpoint-picker mode behind Envoy shaped like Istio's InferencePool support, once "
                             "per request body mode: buffered, streamed, full-duplex (comma-separated, compared in "
                             "one run, with one --store and one --workers; default: policy mode)")


def parse_modes(text: str, stores: int, workers: int) -> list[str] | str:
    """The body modes asked for, or an error message."""
    modes = [name.strip() for name in text.split(",") if name.strip()]
    if any(mode not in BODY_MODES for mode in modes) or len(set(modes)) < len(modes) or (
            modes and (stores > 1 or workers > 1)):
        return (f"--body-modes takes distinct values among {', '.join(BODY_MODES)} (with one --store and one "
                f"--workers); got {text!r}")
    return modes


def picker_policy(document: dict[str, Any], body_mode: str) -> None:
    """The bench's policy in endpoint-picker mode, its Envoy's ext_proc filter sending bodies as `body_mode` (""
    leaves it in policy mode)."""
    if not body_mode:
        return
    document["mode"] = "endpoint-picker"
    document["envoy"]["request_body_mode"] = body_mode


def pool_cluster(policy: Policy) -> str:
    """The Envoy cluster of the bench's pool (Istio's InferencePool cluster in endpoint-picker mode)."""
    return POOL_CLUSTER if policy.mode == "endpoint-picker" else policy.pools[0].name


def over_buffered(added: dict[str, dict[str, float]], report: dict[str, Any]) -> None:
    """The streamed body modes' added latency over buffered's (same run), printed and in the report."""
    buffered = added.get("with_extproc[buffered]", {})
    for mode in BODY_MODES:
        extra = added.get(f"with_extproc[{mode}]", {})
        if mode == "buffered" or not {"p50", "p99"} <= extra.keys() & buffered.keys():
            continue
        difference = {q: round(extra[q] - buffered[q], 3) for q in ("p50", "p99")}
        report[f"{mode}_minus_buffered_ms"] = difference
        print(f"{mode} request bodies over buffered, same run: p50 {difference['p50']} ms, p99 {difference['p99']} ms")
