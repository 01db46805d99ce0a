"""Stateful Responses: a `previous_response_id` continues a response stored by the engine that served it.

vLLM keeps stored responses in its own process (unless its store is shared), and a response's id is the
request's `request_id` field (a random one when absent). So the gateway writes that field itself for every
Responses request: `resp_` + a tag of the endpoint it picked (8 hex digits of a hash of the pool and the
address) + 32 random hex digits. A later request naming that id as `previous_response_id` goes to the endpoint
with that tag while it is usable, on every replica alike and with no shared state. Writing the field also takes
it from the client: nobody chooses another conversation's id, and ids stay unguessable (128 random bits).
Not covered: a retry to a fallback endpoint (connect failure) stores the response there, under the primary's
tag; an endpoint that is no longer usable loses its conversations (the engine answers 404, as vLLM does).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from extproc.endpoints import Endpoint

__all__ = ["endpoint_tag", "new_response_id", "pinned_endpoint"]

_PREFIX = "resp_"
_TAG_LEN = 8


def endpoint_tag(pool: str, address: str) -> str:
    return hashlib.blake2b(f"{pool}/{address}".encode(), digest_size=_TAG_LEN // 2).hexdigest()


def new_response_id(pool: str, address: str) -> str:
    return _PREFIX + endpoint_tag(pool, address) + secrets.token_hex(16)


def pinned_endpoint(previous_id: str, pool: str, candidates: Sequence[Endpoint]) -> Endpoint | None:
    """The usable endpoint that stored `previous_id`, if the id is one of ours and it is still a candidate."""
    if not previous_id.startswith(_PREFIX) or len(previous_id) != len(_PREFIX) + _TAG_LEN + 32:
        return None
    tag = previous_id[len(_PREFIX):len(_PREFIX) + _TAG_LEN]
    return next((e for e in candidates if endpoint_tag(pool, e.address) == tag), None)
