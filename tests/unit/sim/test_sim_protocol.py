from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from extproc.sim.profile import Profile
from extproc.sim.protocol import (
    ApiError,
    Limits,
    embedding_vector,
    output_plan,
    parse_completion_prompt,
    parse_embedding_inputs,
    parse_limits,
)
from extproc.sim.responses import StreamFormatter
from extproc.sim.tokens import Tokenizer

PROFILE = Profile(max_model_len=1000, default_max_tokens=128, max_tokens_cap=500, min_output_fraction=0.5)
TOK = Tokenizer(PROFILE.vocab_size)


def limits(max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False) -> Limits:
    return Limits(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, stream=False,
                  include_usage=False, seed=None)


def test_default_and_capped_max_tokens() -> None:
    assert parse_limits({}, 10, PROFILE, chat=True).max_tokens == 128
    assert parse_limits({"max_tokens": 700}, 10, PROFILE, chat=False).max_tokens == 500
    assert parse_limits({"max_tokens": 5, "max_completion_tokens": 7}, 10, PROFILE, chat=True).max_tokens == 7
    # The default shrinks to the room left in the context instead of failing.
    assert parse_limits({}, 950, PROFILE, chat=True).max_tokens == 50


def test_context_overflow_is_a_400_like_vllm() -> None:
    with pytest.raises(ApiError) as err:
        parse_limits({"max_tokens": 100}, 950, PROFILE, chat=True)
    assert err.value.status == 400 and "maximum context length is 1000" in err.value.message
    with pytest.raises(ApiError):
        parse_limits({}, 1000, PROFILE, chat=True)


@pytest.mark.parametrize("body", [
    {"max_tokens": -1}, {"max_tokens": "9"}, {"stream": "yes"}, {"n": 2},
    {"stream_options": {"include_usage": True}}, {"seed": 1.5},
])
def test_bad_sampling_fields_are_400(body: dict[str, object]) -> None:
    with pytest.raises(ApiError) as err:
        parse_limits(body, 10, PROFILE, chat=True)
    assert err.value.status == 400


def test_output_plan_is_deterministic_and_bounded() -> None:
    plain = limits(100)
    lengths = [output_plan(list(range(i, i + 20)), plain, PROFILE, seed=0)[0] for i in range(200)]
    assert all(50 <= n <= 100 for n in lengths)
    assert len(set(lengths)) > 20
    assert output_plan([1, 2, 3], plain, PROFILE, 0) == output_plan([1, 2, 3], plain, PROFILE, 0)
    assert output_plan([1, 2, 3], plain, PROFILE, 0)[2] != output_plan([1, 2, 3], plain, PROFILE, 1)[2]


def test_ignore_eos_and_min_tokens() -> None:
    assert output_plan([1], limits(40, ignore_eos=True), PROFILE, 0)[:2] == (40, "length")
    low = Profile(min_output_fraction=0.0)
    floor = limits(40, min_tokens=39)
    assert all(output_plan([i], floor, low, 0)[0] >= 39 for i in range(50))


def test_completion_prompt_forms() -> None:
    assert parse_completion_prompt({"prompt": "hi there"}, TOK)[1] == TOK.encode("hi there")
    assert parse_completion_prompt({"prompt": [[5, 6, 7]]}, TOK)[1] == [5, 6, 7]
    assert parse_completion_prompt({"prompt": ["one"]}, TOK)[0] == "one"
    for bad in ({"prompt": ["a", "b"]}, {"prompt": 3}, {}, {"prompt": ""}, {"prompt": []}):
        with pytest.raises(ApiError):
            parse_completion_prompt(bad, TOK)


def test_embedding_inputs_and_vectors() -> None:
    inputs = parse_embedding_inputs({"input": ["a b", [1, 2]]}, TOK)
    assert inputs == [TOK.encode("a b"), [1, 2]]
    vec = embedding_vector([1, 2, 3], 32, "float")
    assert isinstance(vec, list) and len(vec) == 32
    assert np.linalg.norm(vec) == pytest.approx(1.0, rel=1e-5)
    assert vec == embedding_vector([1, 2, 3], 32, "float") != embedding_vector([1, 2, 4], 32, "float")
    raw = embedding_vector([1, 2, 3], 32, "base64")
    assert isinstance(raw, str)
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    assert decoded.tolist() == pytest.approx(vec)


def test_stream_formatter_chunks_are_valid_sse_json() -> None:
    fmt = StreamFormatter("chatcmpl-1", 7, 'm"x', chat=True)
    role = json.loads(fmt.role()[6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = fmt.text(' "quoted"\n', "stop")
    assert last.startswith(b"data: ") and last.endswith(b"\n\n")
    body = json.loads(last[6:])
    assert body["model"] == 'm"x' and body["object"] == "chat.completion.chunk"
    assert body["choices"][0] == {"index": 0, "delta": {"content": ' "quoted"\n'}, "logprobs": None,
                                  "finish_reason": "stop", "stop_reason": None}
    usage = json.loads(fmt.usage({"prompt_tokens": 1})[6:])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 1}
    text = json.loads(StreamFormatter("cmpl-1", 7, "m", chat=False).text("abc")[6:])
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "abc"
    assert text["choices"][0]["finish_reason"] is None
