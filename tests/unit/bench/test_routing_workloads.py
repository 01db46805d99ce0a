from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from typing import Any

import pytest

from extproc.bench.loadgen import RequestSpec
from extproc.bench.workloads import (
    MixedPool,
    MultiTurnChats,
    mixed_workload,
    multi_turn_workload,
    prompt_text,
    shared_prefix_workload,
)
from extproc.sim.tokens import Tokenizer


def _body(spec: RequestSpec) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(spec.body)
    return body


def test_prompt_text_is_one_simulator_token_per_word() -> None:
    text = prompt_text(random.Random(1), 500)
    assert len(Tokenizer(128_256).encode(text)) == 500
    assert 3.5 <= len(text) / 500 <= 5.5  # roughly 4 characters per token, as real tokenizers give


def test_shared_prefix_is_deterministic_per_seed() -> None:
    a, b = shared_prefix_workload("m", seed=3), shared_prefix_workload("m", seed=3)
    assert [a.next_spec(i) for i in range(50)] == [b.next_spec(i) for i in range(50)]
    assert a.next_spec(7) == a.next_spec(7)  # random access is fine: each index has its own generator
    other = shared_prefix_workload("m", seed=4)
    assert [_body(a.next_spec(i)) for i in range(5)] != [_body(other.next_spec(i)) for i in range(5)]


def test_shared_prefix_groups_share_exact_system_text() -> None:
    workload = shared_prefix_workload("m", seed=0, groups=32)
    systems: dict[str, set[str]] = defaultdict(set)
    questions: set[str] = set()
    for i in range(400):
        spec = workload.next_spec(i)
        body = _body(spec)
        assert spec.stream and body["stream"] and body["stream_options"] == {"include_usage": True}
        assert 32 <= body["max_tokens"] <= 128
        system, question = body["messages"]
        systems[spec.labels["group"]].add(system["content"])
        questions.add(question["content"])
        assert len(question["content"].split()) <= 48
    assert len(systems) == 32
    assert all(len(texts) == 1 for texts in systems.values())
    prompts = [next(iter(texts)) for texts in systems.values()]
    assert len(set(prompts)) == 32
    assert all(1500 <= len(p.split()) - 3 <= 3000 for p in prompts)
    assert len(questions) > 390  # many different short questions
    expected = sum(len(p.split()) + 8 for p in prompts)
    assert workload.prefix_working_set_tokens == {"chat": expected}


def _conversations(chats: MultiTurnChats, count: int) -> dict[str, list[tuple[int, list[dict[str, str]]]]]:
    by_conversation: dict[str, list[tuple[int, list[dict[str, str]]]]] = defaultdict(list)
    for i in range(count):
        spec = chats(i)
        by_conversation[spec.labels["conversation"]].append((int(spec.labels["turn"]), _body(spec)["messages"]))
    return by_conversation


def test_multi_turn_histories_grow_and_stay_prefix_identical() -> None:
    conversations = _conversations(MultiTurnChats("m", seed=1, conversations=8), 300)
    multi_turn = 0
    for turns in conversations.values():
        for number, (turn, messages) in enumerate(turns):
            assert turn == number + 1
            assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
            assert len(messages) == 2 * turn  # system + (user, assistant) per earlier turn + the new question
        for (_, before), (_, after) in itertools.pairwise(turns):
            assert after[: len(before)] == before  # the previous prompt is an exact prefix
            assert after[len(before)]["role"] == "assistant" and after[len(before)]["content"]
            assert len(json.dumps(after)) > len(json.dumps(before))
        multi_turn += len(turns) > 2
        assert len(turns) <= 8
    assert multi_turn > 10
    assert len({m[0][1][0]["content"] for m in conversations.values()}) == len(conversations)


def test_multi_turn_is_deterministic_and_ordered() -> None:
    a, b = MultiTurnChats("m", seed=5), MultiTurnChats("m", seed=5)
    sequence = [a(i) for i in range(60)]
    assert sequence == [b(i) for i in range(60)]
    skipping = MultiTurnChats("m", seed=5)
    assert skipping(59) == sequence[59]  # skipped indices are generated and dropped, so state matches
    with pytest.raises(ValueError, match="in order"):
        skipping(3)
    assert _body(sequence[0]) != _body(MultiTurnChats("m", seed=6)(0))
    workload = multi_turn_workload("m", seed=0, conversations=32)
    assert workload.name == "multi-turn"
    # 32 conversations x (400 system + 8 + 5.5 turns x (28 + 80 + 16)) tokens at their longest.
    assert workload.prefix_working_set_tokens == {"chat": round(32 * (400 + 8 + 5.5 * 124))}


def test_mixed_hits_both_models_adapters_and_both_lengths() -> None:
    pools = (MixedPool("chat", "base", 0.6, ("lora-a", "lora-b")), MixedPool("code", "coder", 0.4))
    workload = mixed_workload(pools, seed=2)
    assert workload.next_spec(11) == mixed_workload(pools, seed=2).next_spec(11)
    seen: dict[str, set[str]] = defaultdict(set)
    documents: dict[str, set[str]] = defaultdict(set)
    for i in range(600):
        spec = workload.next_spec(i)
        body = _body(spec)
        labels = spec.labels
        assert body["model"] == labels["model"]
        seen["pool:" + labels["pool"]].add(labels["model"])
        seen["kind"].add(labels["kind"])
        if labels["kind"] == "long":
            documents[labels["group"]].add(body["messages"][0]["content"])
            assert len(body["messages"][0]["content"].split()) > 1500
        else:
            assert len(body["messages"][1]["content"].split()) <= 200
    assert seen["pool:chat"] == {"base", "lora-a", "lora-b"}
    assert seen["pool:code"] == {"coder"}
    assert seen["kind"] == {"long", "short"}
    assert all(len(texts) == 1 for texts in documents.values())  # one document text per (name, document)
    all_texts = [t for texts in documents.values() for t in texts]
    assert len(all_texts) == len(set(all_texts))  # a document is cached under one name only
    assert set(workload.prefix_working_set_tokens) == {"chat", "code"}
