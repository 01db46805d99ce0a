"""The OpenAI-style APIs the gateway routes, and which path serves each."""

from __future__ import annotations

import enum

__all__ = ["PATHS", "Api", "api_for_path"]


class Api(enum.Enum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"


PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
}


def api_for_path(path: str) -> Api | None:
    return PATHS.get(path.partition("?")[0].rstrip("/") or "/")
