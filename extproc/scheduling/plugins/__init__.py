"""Built-in scheduling plugins, one module each; `register_builtins` is the only place they are listed."""

from __future__ import annotations

from extproc.scheduling.plugins import (
    inflight,
    kv_utilization,
    latency,
    lora_affinity,
    pickers,
    prefix_affinity,
    queue_depth,
    saturation,
    session_affinity,
)
from extproc.scheduling.registry import PluginRegistry

MODULES = (inflight, kv_utilization, latency, lora_affinity, pickers, prefix_affinity, queue_depth, saturation,
           session_affinity)


def register_builtins(registry: PluginRegistry) -> None:
    for module in MODULES:
        module.register(registry)
