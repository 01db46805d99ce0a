from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.openai import Api, ApiError, api_for_path, cap_output_tokens, estimate_tokens, parse_request, rewrite_body


def parse(api: Api, body: bytes | dict[str, object], max_bytes: int = 1 << 20, max_depth: int = 8):  # type: ignore[no-untyped-def]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(api, raw, max_bytes=max_bytes, max_depth=max_depth)


def test_paths_map_to_apis() -> None:
    assert api_for_path("/v1/chat/completions") is Api.CHAT
    assert api_for_path("/v1/completions?x=1") is Api.COMPLETIONS
    assert api_for_path("/v1/embeddings/") is Api.EMBEDDINGS
    assert api_for_path("/v1/models") is None


def test_chat_fields() -> None:
    request = parse(Api.CHAT, {
        "model": "m", "stream": True, "max_completion_tokens": 64, "stream_options": {"include_usage": True},
        "user": "u1",
        "messages": [{"role": "system", "content": "sys"},
                     {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}]}],
    })
    assert (request.model, request.stream, request.max_output_tokens, request.include_usage, request.user) == (
        "m", True, 64, True, "u1")
    assert "sys" in request.prompt_text and "hello" in request.prompt_text


def test_completions_and_embeddings_prompts() -> None:
    assert parse(Api.COMPLETIONS, {"model": "m", "prompt": ["a", "b"], "max_tokens": 5}).prompt_text == "a\nb"
    assert parse(Api.EMBEDDINGS, {"model": "m", "input": "text"}).max_output_tokens is None
    assert parse(Api.COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}).prompt_text == "1 2 3"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1]", "invalid_json"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}', "invalid_json"),
        ({"messages": []}, "missing_model"),
        ({"model": 3, "messages": []}, "missing_model"),
        ({"model": "m", "messages": []}, "invalid_value"),
        ({"model": "m", "messages": ["x"]}, "invalid_value"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "invalid_value"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "invalid_value"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "invalid_value"),
    ],
)
def test_bad_bodies_are_400_with_code(body: bytes | dict[str, object], code: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(Api.CHAT, body)
    assert info.value.status == 400
    assert info.value.code == code
    error = json.loads(info.value.body())["error"]
    assert set(error) == {"message", "type", "param", "code"}


def test_depth_and_size_bounds() -> None:
    nested: dict[str, object] = {"model": "m", "prompt": "x"}
    leaf: dict[str, object] = nested
    for _ in range(10):
        child: dict[str, object] = {}
        leaf["x"] = child
        leaf = child
    with pytest.raises(ApiError, match="nesting"):
        parse(Api.COMPLETIONS, nested, max_depth=8)
    with pytest.raises(ApiError) as info:
        parse(Api.COMPLETIONS, {"model": "m", "prompt": "x" * 2000}, max_bytes=1000)
    assert info.value.status == 413


def test_pathological_nesting_does_not_crash() -> None:
    with pytest.raises(ApiError, match=r"nesting|JSON"):
        parse(Api.COMPLETIONS, b"[" * 200_000 + b"]" * 200_000)


def test_stream_not_allowed_for_embeddings() -> None:
    with pytest.raises(ApiError):
        parse(Api.EMBEDDINGS, {"model": "m", "input": "x", "stream": True})


def test_rewrite_body_keeps_other_fields() -> None:
    out = json.loads(rewrite_body({"model": "alias", "prompt": "héllo", "n": 2}, "served"))
    assert out == {"model": "served", "prompt": "héllo", "n": 2}
    streamed = json.loads(rewrite_body({"model": "m", "stream": True, "stream_options": {"x": 1}}, None, True))
    assert streamed == {"model": "m", "stream": True, "stream_options": {"x": 1, "include_usage": True}}


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd" * 100) == 100


@pytest.mark.parametrize(("api", "fields", "expected"), [
    (Api.CHAT, {}, {"max_tokens": 64}),
    (Api.CHAT, {"max_tokens": 500}, {"max_tokens": 64}),
    (Api.CHAT, {"max_completion_tokens": 500, "max_tokens": 10}, {"max_completion_tokens": 64, "max_tokens": 10}),
    (Api.COMPLETIONS, {"max_tokens": None}, {"max_tokens": 64}),
])
def test_output_cap_lowers_or_sets_the_limit(api: Api, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    key = "messages" if api is Api.CHAT else "prompt"
    body = {"model": "m", key: [{"role": "user", "content": "hi"}] if api is Api.CHAT else "hi", **fields}
    request = parse_request(api, json.dumps(body).encode(), max_bytes=10_000, max_depth=8)
    capped = cap_output_tokens(request, 64)
    assert capped is not None and capped.max_output_tokens == 64
    assert {k: capped.document[k] for k in expected} == expected


def test_output_cap_leaves_smaller_limits_and_embeddings_alone() -> None:
    small = parse_request(Api.CHAT, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                "max_tokens": 8}).encode(), max_bytes=10_000, max_depth=8)
    assert cap_output_tokens(small, 64) is None
    embed = parse_request(Api.EMBEDDINGS, b'{"model": "e", "input": "x"}', max_bytes=10_000, max_depth=8)
    assert cap_output_tokens(embed, 64) is None and "max_tokens" not in embed.document


def test_rewrite_never_fails_on_a_surrogate() -> None:
    out = rewrite_body({"model": "a", "messages": [{"role": "user", "content": "x\ud800y"}]}, "served")
    assert json.loads(out)["messages"][0]["content"] == "x\ud800y" and out.isascii()
