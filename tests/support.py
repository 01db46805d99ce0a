"""Helpers shared by tests."""

from __future__ import annotations

from extproc.bench.stack import free_ports
from extproc.xds import find_envoy


def envoy_binary() -> str:
    return find_envoy()


__all__ = ["envoy_binary", "free_ports"]
