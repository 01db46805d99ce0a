"""Stateful Responses: a `previous_response_id` continues a response stored by the engine that served it.

vLLM keeps stored responses in its own process (unless its store is shared), and a response's id is the
request's `request_id` field (a random one when absent). So the gateway writes that field itself for every
Responses request: `resp_` + a tag of the endpoint it picked and one of its first fallback (8 hex digits each,
of a hash of the pool and the address; the primary's again without a fallback) + 32 random hex digits. A later
request naming that id as `previous_response_id` goes to the primary while it is usable, else to the fallback,
on every replica alike and with no shared state: when the primary could not be reached, Envoy's retry went to
that fallback, which stored the response, and the primary is then usually out of the pool's usable endpoints
(passive health, outlier detection). Writing the field also takes it from the client: nobody chooses another
conversation's id, and ids stay unguessable (128 random bits). Ids of the earlier form (the primary's tag only)
are still followed. Not covered: a primary that failed one connect and is usable again gets the continuation
(404 from the engine, as vLLM answers for an unknown id); an endpoint no longer usable loses its conversations.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from extproc.endpoints import Endpoint

__all__ = ["endpoint_tag", "new_response_id", "pinned_endpoint"]

_PREFIX = "resp_"
_TAG_LEN = 8
_LEN = len(_PREFIX) + 2 * _TAG_LEN + 32
_LEGACY_LEN = len(_PREFIX) + _TAG_LEN + 32  # ids written before the fallback's tag was added


def endpoint_tag(pool: str, address: str) -> str:
    return hashlib.blake2b(f"{pool}/{address}".encode(), digest_size=_TAG_LEN // 2).hexdigest()


def new_response_id(pool: str, address: str, fallback: str | None = None) -> str:
    return _PREFIX + endpoint_tag(pool, address) + endpoint_tag(pool, fallback or address) + secrets.token_hex(16)


def pinned_endpoint(previous_id: str, pool: str, candidates: Sequence[Endpoint]) -> Endpoint | None:
    """The usable endpoint that stored `previous_id` (its primary, else its first fallback), if the id is one
    of ours and that endpoint is still a candidate."""
    if not previous_id.startswith(_PREFIX) or len(previous_id) not in (_LEGACY_LEN, _LEN):
        return None
    start = len(_PREFIX)
    tags = [previous_id[start:start + _TAG_LEN]]
    if len(previous_id) == _LEN:
        tags.append(previous_id[start + _TAG_LEN:start + 2 * _TAG_LEN])
    by_tag = {endpoint_tag(pool, e.address): e for e in candidates}
    return next((by_tag[tag] for tag in tags if tag in by_tag), None)
