"""Every prompt-bearing field, per API (extproc/openai/prompt.py), and the structural bounds of a body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.openai import Api, ApiError, decode_json, parse_request
from extproc.openai.prompt import extra_prompt_chars, prompt_slots, prompt_text, unreadable_prompt


def texts(api: Api, document: dict[str, Any]) -> list[str]:
    said, _ = prompt_slots(api, document)
    return [key if container is None else container[key] for container, key in said]


def test_chat_fields_vllm_renders_are_all_read_in_document_order() -> None:
    document = {
        "model": "m",
        "messages": [
            {"role": "user", "name": "n1", "content": [{"type": "text", "text": "t1"},
                                                       {"type": "image_url", "image_url": {"url": "data:xyz"}}]},
            {"role": "assistant", "content": {"type": "text", "text": "t2"}, "reasoning": "r1",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        ],
        "tools": [{"type": "function", "function": {"name": "g", "description": "d1",
                                                     "parameters": {"properties": {"p1": {"description": "d2"}}}}}],
        "documents": [{"title": "T", "text": "doc"}], "chat_template": "tpl", "chat_template_kwargs": {"k": "v"},
        "user": "not rendered", "response_format": {"type": "json_schema", "json_schema": {"name": "s"}},
    }
    said = texts(Api.CHAT, document)
    assert said[:5] == ["n1", "t1", "t2", "r1", "f"]
    for expected in ("{\"a\": 1}", "d1", "d2", "doc", "tpl", "v", "s"):
        assert expected in said
    assert "data:xyz" not in said and "not rendered" not in said  # media and non-prompt fields are skipped
    _, meta = prompt_slots(Api.CHAT, document)
    keys = [key for container, key in meta if container is None]
    assert "p1" in keys  # a tool's parameter names reach the prompt too
    assert "user" in [container[key] for container, key in meta if container is not None]  # the role, apart


def test_completions_suffix_and_embedding_messages() -> None:
    assert texts(Api.COMPLETIONS, {"model": "m", "prompt": ["a", "b"], "suffix": "s"}) == ["a", "b", "s"]
    assert texts(Api.EMBEDDINGS, {"model": "m", "messages": [{"role": "user", "content": "x"}]}) == ["x"]
    assert prompt_text(Api.EMBEDDINGS, {"model": "m", "messages": [{"role": "user", "content": "x"}]}) == "<|user|>x"


def test_content_as_an_object_counts_as_text() -> None:
    assert prompt_text(Api.CHAT, {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}) == (
        "<|user|>hi")


def test_extra_prompt_chars_count_what_prompt_text_leaves_out() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    assert extra_prompt_chars(Api.CHAT, plain) == 0
    tools = {**plain, "tools": [{"type": "function", "function": {"name": "f", "description": "x" * 400}}]}
    assert extra_prompt_chars(Api.CHAT, tools) > 400


@pytest.mark.parametrize(("api", "document", "field"), [
    (Api.COMPLETIONS, {"prompt": [1, 2]}, "prompt"),
    (Api.COMPLETIONS, {"prompt": "x", "prompt_embeds": "AAAA"}, "prompt_embeds"),
    (Api.EMBEDDINGS, {"input": [[1, 2]]}, "input"),
    (Api.COMPLETIONS, {"prompt": ["a"]}, None),
])
def test_unreadable_prompts_are_named(api: Api, document: dict[str, Any], field: str | None) -> None:
    assert unreadable_prompt(api, document) == field


def test_message_count_is_bounded_before_any_walk() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}] * 5}).encode()
    with pytest.raises(ApiError) as info:
        parse_request(Api.CHAT, body, max_bytes=10_000, max_depth=8, max_messages=4)
    assert (info.value.status, info.value.param) == (400, "messages")


def test_container_count_is_bounded() -> None:
    body = json.dumps({"model": "m", "prompt": "x", "junk": [[]] * 100}).encode()
    with pytest.raises(ApiError) as info:
        parse_request(Api.COMPLETIONS, body, max_bytes=10_000, max_depth=8, max_containers=50)
    assert (info.value.status, info.value.code) == (413, "request_too_complex")
    ids = json.dumps({"model": "m", "prompt": list(range(5000))}).encode()  # scalars cost no container
    assert parse_request(Api.COMPLETIONS, ids, max_bytes=100_000, max_depth=8, max_containers=50).model == "m"


@pytest.mark.parametrize("raw", [b'{"a": "\\ud800"}', b'{"a": "x\\udfff"}', b'{"a": NaN}', b'{"a": Infinity}'])
def test_lone_surrogates_and_non_json_numbers_are_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        decode_json(raw, max_bytes=1000)
    assert (info.value.status, info.value.code) == (400, "invalid_json")


def test_surrogate_pairs_and_escaped_backslashes_are_fine() -> None:
    assert decode_json(b'{"a": "\\ud83d\\ude00"}', max_bytes=1000) == {"a": "\U0001f600"}
    assert decode_json(b'{"a": "\\\\ud800"}', max_bytes=1000) == {"a": "\\ud800"}
