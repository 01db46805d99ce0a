"""`extproc bench overhead`'s stack: the bootstrap that adds a direct-response backend (and, once, a bare listener)
to the rendered Envoy, and the request every variant gets (extproc/bench/overhead.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from extproc.bench.body_modes import pool_cluster
from extproc.bench.loadgen import RequestSpec
from extproc.config import Policy
from extproc.xds.render import render_static

MODEL = "bench-model"
_BACKEND_BODY = json.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
})


def _listener(name: str, port: int, routes: list[dict[str, Any]], filters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                         "HttpConnectionManager",
                "stat_prefix": name,
                "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": filters,
            },
        }]}],
    }


def bench_bootstrap(policy: Policy, direct_port: int, bare_port: int | None) -> dict[str, Any]:
    """The rendered Envoy plus its own direct-response backend on `direct_port` (every variant's Envoy has one,
    so each measured path is client -> Envoy -> the same Envoy's backend, none pays a hop to another Envoy
    process) and, with `bare_port`, the bare listener (Envoy alone) of the first variant."""
    bootstrap = render_static(policy)
    router = [{"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
    backend = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": _BACKEND_BODY}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]}]
    bare = [{"match": {"prefix": "/"}, "route": {"cluster": pool_cluster(policy)}}]
    bootstrap["static_resources"]["listeners"].append(_listener("backend", direct_port, backend, router))
    if bare_port is not None:
        bootstrap["static_resources"]["listeners"].append(_listener("bare", bare_port, bare, router))
    return bootstrap


_PROSE = ("The Q3 2025 report covers revenue (up 12.5% to 4.2 million), churn and the roadmap for releases "
          "7.1 and 7.2 due 2025-11-30; questions go to finance.team@example.com before Friday. ")


def request_spec(prompt_chars: int, system_chars: int = 0) -> Callable[[int], RequestSpec]:
    """Every request the same (`prompt_chars` of prose, or 'Say ok.'); with `system_chars`, a system prompt of that
    many characters first, the same for every request, and a user prompt numbered per request (a shared prefix)."""
    text = (_PROSE * (prompt_chars // len(_PROSE) + 1))[:prompt_chars] if prompt_chars > 0 else "Say ok."
    headers = (("content-type", "application/json"),)
    if system_chars > 0:
        system = (_PROSE * (system_chars // len(_PROSE) + 1))[:system_chars]

        def numbered(index: int) -> RequestSpec:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"{index}: {text}"}]
            body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1}).encode()
            return RequestSpec("POST", "/v1/chat/completions", headers, body)

        return numbered
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    spec = RequestSpec("POST", "/v1/chat/completions", headers, body)
    return lambda _: spec
