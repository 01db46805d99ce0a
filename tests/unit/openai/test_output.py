"""Output bounds per API, as vLLM reads each field (extproc/openai/output.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extproc.openai import Api, ApiError, cap_output_tokens, parse_request
from extproc.openai.output import COMPLETIONS_DEFAULT_MAX_TOKENS, cap_document, output_bound


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(("fields", "bound"), [
    ({}, None),  # up to the context length
    ({"max_tokens": 50}, 50),
    ({"max_completion_tokens": 50}, 50),
    ({"max_completion_tokens": 1, "max_tokens": 1000}, 1),  # both releases read max_completion_tokens
    ({"max_completion_tokens": 0, "max_tokens": 5000}, 5000),  # older vLLM: `0 or max_tokens`
    ({"max_completion_tokens": 0}, None),  # older vLLM: `0 or None` = unbounded
    ({"max_completion_tokens": None, "max_tokens": 7}, 7),
])
def test_chat_bound_holds_under_every_vllm_reading(fields: dict[str, Any], bound: int | None) -> None:
    assert output_bound(Api.CHAT, chat(**fields), 128) == (bound, 1)


@pytest.mark.parametrize(("fields", "bound"), [
    ({}, COMPLETIONS_DEFAULT_MAX_TOKENS),  # absent: vLLM's default of 16
    ({"max_tokens": None}, None),  # explicit null: up to the context length
    ({"max_tokens": 1000, "max_completion_tokens": 1}, 1000),  # completions never read max_completion_tokens
    ({"max_tokens": 0, "echo": True}, 1),  # echo without generation still generates one token
])
def test_completions_read_max_tokens_only(fields: dict[str, Any], bound: int | None) -> None:
    assert output_bound(Api.COMPLETIONS, {"model": "m", "prompt": "x", **fields}, 128) == (bound, 1)


@pytest.mark.parametrize(("document", "sequences"), [
    (chat(n=4), 4),
    (chat(n=2, best_of=5), 5),
    ({"model": "m", "prompt": ["a", "b", "c"], "n": 2}, 6),  # a batch: every prompt is a request
    ({"model": "m", "prompt": [[1, 2], [3]]}, 2),
    ({"model": "m", "prompt": [1, 2, 3]}, 1),  # one token-id prompt
])
def test_choices_and_batches_multiply_sequences(document: dict[str, Any], sequences: int) -> None:
    api = Api.CHAT if "messages" in document else Api.COMPLETIONS
    assert output_bound(api, document, 128)[1] == sequences


@pytest.mark.parametrize("fields", [{"n": 0}, {"n": "2"}, {"best_of": 2.0}, {"n": 129}, {"max_tokens": "5"}])
def test_bad_choice_fields_are_400(fields: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as info:
        output_bound(Api.CHAT, chat(**fields), 128)
    assert info.value.status == 400


def test_total_output_is_per_sequence_times_sequences() -> None:
    request = parse_request(Api.COMPLETIONS, json.dumps({"model": "m", "prompt": ["a", "b"], "n": 3,
                                                         "max_tokens": 10}).encode(), max_bytes=10_000, max_depth=8)
    assert (request.max_output_tokens, request.sequences, request.output_tokens) == (10, 6, 60)
    unbounded = parse_request(Api.CHAT, json.dumps(chat()).encode(), max_bytes=10_000, max_depth=8)
    assert unbounded.output_tokens is None


@pytest.mark.parametrize(("api", "fields", "expected"), [
    (Api.COMPLETIONS, {"max_completion_tokens": 1, "max_tokens": 1000}, {"max_completion_tokens": 1, "max_tokens": 32}),
    (Api.CHAT, {"max_completion_tokens": 0, "max_tokens": 5000}, {"max_completion_tokens": 0, "max_tokens": 32}),
    (Api.CHAT, {"max_completion_tokens": 0}, {"max_completion_tokens": 0, "max_tokens": 32}),
    (Api.CHAT, {"max_completion_tokens": 900}, {"max_completion_tokens": 32}),
])
def test_cap_lands_in_the_field_the_engine_reads(api: Api, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    document = chat(**fields) if api is Api.CHAT else {"model": "m", "prompt": "x", **fields}
    bound, _ = output_bound(api, document, 128)
    assert cap_document(api, document, bound, 32)
    assert {k: document.get(k) for k in expected} == expected
    assert output_bound(api, document, 128)[0] == 32  # every reading now ends at the cap


def test_cap_of_a_parsed_request() -> None:
    request = parse_request(Api.COMPLETIONS, json.dumps({"model": "m", "prompt": "x", "max_completion_tokens": 1,
                                                         "max_tokens": 1000}).encode(), max_bytes=10_000, max_depth=8)
    assert request.max_output_tokens == 1000
    capped = cap_output_tokens(request, 32)
    assert capped is not None and capped.max_output_tokens == 32 and capped.document["max_tokens"] == 32
