"""Secrets the service and the rendered Envoy config share, read from files (e.g. Kubernetes Secret
volumes); never from the policy file itself, which is a ConfigMap."""

from __future__ import annotations

from pathlib import Path

__all__ = ["GRPC_TOKEN_METADATA", "read_secret"]

# gRPC metadata carrying `service.grpc_token_file`'s token on Envoy's ext_proc and access-log streams.
GRPC_TOKEN_METADATA = "x-extproc-token"


def read_secret(path: str | None) -> str | None:
    """The secret in `path` (surrounding whitespace removed), None without a path; an empty file is an error."""
    if path is None:
        return None
    secret = Path(path).read_text(encoding="utf-8").strip()
    if not secret:
        raise ValueError(f"{path} holds no secret")
    return secret
