"""Envoy configuration rendered from the policy (bootstrap + file-based xDS)."""

from extproc.xds.render import render_files, render_static, write_config

__all__ = ["render_files", "render_static", "write_config"]
