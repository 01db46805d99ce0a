from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from typing import Any

import pytest

from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_workloads import (
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


def _conversations(chats: MultiTurnChats, count: int) -> dict[str, list[tuple[int, int, dict[str, Any], str]]]:
    by_conversation: dict[str, list[tuple[int, int, dict[str, Any], str]]] = defaultdict(list)
    for i in range(count):
        spec = chats(i)
        labels = spec.labels
        by_conversation[labels["conversation"]].append((i, int(labels["turn"]), _body(spec), labels["user"]))
    return by_conversation


def test_multi_turn_histories_grow_once_a_round_with_several_users_per_system_prompt() -> None:
    chats = MultiTurnChats("m", seed=1, system_prompts=3, users=4, system_tokens=(50, 80))
    conversations = _conversations(chats, 600)
    systems: dict[str, set[str]] = defaultdict(set)
    gaps: set[int] = set()
    for turns in conversations.values():
        for number, (_, turn, body, _) in enumerate(turns):
            messages = body["messages"]
            assert turn == number + 1 and len(messages) == 2 * turn
            assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
            assert body["ignore_eos"] and 50 <= body["max_tokens"] <= 150
        for (i, _, before, _), (j, _, after, _) in itertools.pairwise(turns):
            gaps.add(j - i)
            assert after["messages"][: len(before["messages"])] == before["messages"]  # exact prefix
            answer = after["messages"][len(before["messages"])]
            assert answer["role"] == "assistant" and len(answer["content"].split()) == before["max_tokens"]
        assert len({user for *_, user in turns}) == 1  # a conversation is one user's
        systems[turns[0][2]["messages"][0]["content"]].add(turns[0][3])
    assert len(systems) == 3 and all(len(users) == 4 for users in systems.values())  # 4 users per prompt
    # A user's next turn comes half a round to one and a half rounds of the 3 x 4 users later, not always 12.
    assert min(gaps) > 6 and max(gaps) < 18 and len(gaps) > 3
    lengths = [len(turns) for number, turns in conversations.items() if 12 <= int(number) < 40
               and turns[-1][0] + 18 < 600]  # later conversations that ended within the sample (gap < 18)
    assert lengths and min(lengths) >= 5 and max(lengths) <= 10
    first_round = [len(turns) for number, turns in conversations.items() if int(number) < 12]
    assert min(first_round) < 5  # the first round is cut at random turns: ends are staggered


def test_multi_turn_order_changes_who_follows_whom_every_round() -> None:
    # In plain slot order system prompt p was always followed by p + 1: an engine holding both got its
    # arrivals in pairs. Every round is shuffled instead, and each round still visits every user once.
    chats = MultiTurnChats("m", seed=3, system_prompts=12, users=8, system_tokens=(20, 30))
    specs = [chats(i) for i in range(96 * 4)]
    for start in range(0, len(specs), 96):
        assert sorted(int(s.labels["user"]) for s in specs[start:start + 96]) == list(range(96))
    following: dict[str, set[str]] = defaultdict(set)
    for before, after in itertools.pairwise(specs):
        following[before.labels["group"]].add(after.labels["group"])
    assert all(len(nexts) >= 6 for nexts in following.values())
    same = sum(a.labels["group"] == b.labels["group"] for a, b in itertools.pairwise(specs))
    assert 10 <= same <= 60  # about 1 in 12 pairs, as independent users would give (plain order: none)


def test_multi_turn_is_deterministic_and_ordered() -> None:
    a, b = MultiTurnChats("m", seed=5), MultiTurnChats("m", seed=5)
    sequence = [a(i) for i in range(60)]
    assert sequence == [b(i) for i in range(60)]
    skipping = MultiTurnChats("m", seed=5)
    assert skipping(59) == sequence[59]  # skipped indices are generated and dropped, so state matches
    with pytest.raises(ValueError, match="in order"):
        skipping(3)
    assert _body(sequence[0]) != _body(MultiTurnChats("m", seed=6)(0))
    workload = multi_turn_workload("m", seed=0, system_prompts=12, users=8)
    assert workload.name == "multi-turn"
    systems = {_body(workload.next_spec(i))["messages"][0]["content"] for i in range(96)}  # one round
    # 12 system prompts + 96 slots x 7.5 turns / 2 x (75 + 100 + 16) tokens.
    expected = sum(len(s.split()) + 8 for s in systems) + 96 * 7.5 / 2 * 191
    assert workload.prefix_working_set_tokens == {"chat": round(expected)}


def test_drift_moves_the_hot_set_to_the_cold_half() -> None:
    kwargs: dict[str, Any] = {"groups": 8, "prefix_tokens": (20, 20), "popularity": "zipf:1.5"}
    steady = shared_prefix_workload("m", seed=2, **kwargs)
    drift = shared_prefix_workload("m", seed=2, drift_after=100, **kwargs)
    assert drift.name == "drift" and steady.name == "shared-prefix"
    for i in range(300):
        before, after = steady.next_spec(i).labels, drift.next_spec(i).labels
        shift = 0 if i < 100 else 4
        assert int(after["group"]) == (int(before["group"]) + shift) % 8
        assert after["phase"] == ("before" if i < 100 else "after") and "phase" not in before
    late = [drift.next_spec(i).labels["group"] for i in range(100, 1100)]
    assert late.count("4") > 3 * late.count("0")


def test_mixed_one_pool_has_shared_long_one_off_long_and_short_prompts() -> None:
    workload = mixed_workload([MixedPool("chat", "m", 1.0, documents=48)], seed=1)
    kinds: dict[str, int] = defaultdict(int)
    texts: dict[str, set[str]] = defaultdict(set)
    for i in range(1000):
        spec = workload.next_spec(i)
        system, user = _body(spec)["messages"]
        kind = spec.labels["kind"]
        kinds[kind] += 1
        if kind == "long":
            texts[spec.labels["group"]].add(system["content"])
        elif kind == "unique":
            assert len(user["content"].split()) > 1500
            texts["unique"].add(user["content"])
        else:
            assert len(user["content"].split()) <= 200
    assert 300 < kinds["long"] < 500 and 50 < kinds["unique"] < 150 and kinds["short"] > 400
    assert len(texts["unique"]) == kinds["unique"]  # nobody shares a one-off prompt
    assert len(texts) == 49 and all(len(t) == 1 for g, t in texts.items() if g != "unique")


def test_mixed_models_hits_both_models_adapters_and_both_lengths() -> None:
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
        if labels["kind"] == "unique":
            continue
        if labels["kind"] == "long":
            documents[labels["group"]].add(body["messages"][0]["content"])
            assert len(body["messages"][0]["content"].split()) > 1500
        else:
            assert len(body["messages"][1]["content"].split()) <= 200
    assert seen["pool:chat"] == {"base", "lora-a", "lora-b"}
    assert seen["pool:code"] == {"coder"}
    assert seen["kind"] == {"long", "unique", "short"}
    assert all(len(texts) == 1 for texts in documents.values())  # one document text per (name, document)
    all_texts = [t for texts in documents.values() for t in texts]
    assert len(all_texts) == len(set(all_texts))  # a document is cached under one name only
    assert set(workload.prefix_working_set_tokens) == {"chat", "code"}
