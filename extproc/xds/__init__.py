"""Envoy configuration rendered from the policy (bootstrap + file-based xDS)."""

from extproc.xds.binary import find_envoy
from extproc.xds.render import render_files, render_static, write_config

__all__ = ["find_envoy", "render_files", "render_static", "write_config"]
