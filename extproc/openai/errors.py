"""Errors in the API's own shape: OpenAI's `{"error": {"message", "type", "param", "code"}}`, or on the
Anthropic Messages path Anthropic's `{"type": "error", "error": {"type", "message"}}` (its error type follows
the status, as Anthropic's API documents them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ApiError(Exception):
    """A request we refuse, with everything needed to answer it the way OpenAI's API would."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())

    def body(self, anthropic: bool = False) -> bytes:
        payload: dict[str, object]
        if anthropic:
            payload = {"type": "error", "error": {"type": anthropic_type(self.status), "message": self.message}}
        else:
            payload = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return json.dumps(payload, separators=(",", ":")).encode()

    def __str__(self) -> str:
        return f"{self.status} {self.code or self.type}: {self.message}"


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                   529: "overloaded_error"}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def bad_request(message: str, code: str = "invalid_request", param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model '{model}' does not exist or you do not have access to it.",
        "invalid_request_error", "model_not_found", "model",
    )


def not_found(path: str) -> ApiError:
    return ApiError(404, f"Unknown request URL: {path}", "invalid_request_error", "unknown_url")


def method_not_allowed(method: str, path: str) -> ApiError:
    return ApiError(405, f"Method {method} is not allowed on {path}", "invalid_request_error", "method_not_allowed")


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body exceeds the limit of {limit} bytes", "invalid_request_error",
                    "request_too_large")


def too_complex(limit: int) -> ApiError:
    return ApiError(413, f"Request body holds more than {limit} JSON objects and arrays", "invalid_request_error",
                    "request_too_complex")


def too_expensive(budget_ms: float) -> ApiError:
    return ApiError(413, f"Processing the request took more than {budget_ms:g} ms of gateway CPU time",
                    "invalid_request_error", "request_too_complex")


def no_capacity(pool: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(
        503, f"No ready endpoint in pool '{pool}'; retry later", "server_error", "no_capacity",
        headers=(("retry-after", str(retry_after_s)),),
    )
