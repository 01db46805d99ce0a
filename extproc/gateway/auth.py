"""Who is calling: API key, trusted upstream header, or nobody (anonymous)."""

from __future__ import annotations

from extproc.config.schema import AuthConfig
from extproc.gateway.types import RequestHead
from extproc.openai.errors import ApiError
from extproc.tenants import ANONYMOUS, KeyRing, Tenant


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key",
                    headers=(("www-authenticate", 'Bearer realm="llm-gateway"'),))


class Authenticator:
    """Holds the current key ring; the server swaps in a new one when the keys file changes."""

    def __init__(self, keys: KeyRing | None = None) -> None:
        self.keys = keys or KeyRing({})

    def authenticate(self, head: RequestHead, config: AuthConfig, tiers: set[str]) -> Tenant:
        """The tenant, or raises ApiError(401). Never logs or returns the key itself."""
        if config.mode == "none":
            return ANONYMOUS
        if config.mode == "trusted-header":
            name = head.headers.get(config.tenant_header, "").strip()
            if not name:
                raise unauthorized(f"Missing {config.tenant_header} from the upstream authenticator")
            tier = head.headers.get(config.tier_header, "default").strip()
            return Tenant(name[:128], tier if tier in tiers else "default", frozenset())
        authorization = head.headers.get("authorization")
        if authorization is not None:  # it decides when present, whatever x-api-key says
            scheme, _, key = authorization.partition(" ")
            key = key if scheme.lower() == "bearer" else ""
        else:  # Anthropic's header (its SDKs and Claude Code send it)
            key = head.headers.get("x-api-key", "")
        if not key.strip():
            raise unauthorized("You didn't provide an API key. Provide it as 'Authorization: Bearer KEY' "
                               "(or 'x-api-key: KEY').")
        tenant = self.keys.authenticate(key.strip())
        if tenant is None:
            raise unauthorized("Incorrect API key provided.")
        return tenant
