"""Workloads of `extproc bench routing`: deterministic request generators for a seed, plus the prefix working set
that KV sizing needs.

Prompt text is built from short words: the simulator's tokenizer makes one token of each word (with its leading
space), so a text of N words is N prompt tokens at ~4.5 characters per token, close to what real BPE tokenizers
give for English.

- `shared_prefix_workload`: long system prompts ("groups") each followed by many different questions, the groups
  asked with a popularity (uniform or Zipf); optionally the hot set drifts: from one request on, the ranks shift
  by half the groups, so the formerly cold half becomes the hot set.
- `MultiTurnChats`: conversations of several rounds whose history grows, several users per system prompt.
- `mixed_workload`: long prompts after shared documents, long one-off prompts and short prompts, on one pool or
  several (models, LoRA adapters).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.bench.loadgen import RequestSpec
from extproc.bench.workloads import JSON_HEADERS, chat_spec

__all__ = ["TEMPLATE_TOKENS", "MixedPool", "MultiTurnChats", "RoutingWorkload", "mixed_workload",
           "multi_turn_workload", "popularity_weights", "prompt_text", "shared_prefix_workload"]

_SHORT_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "at", "by", "be",
    "this", "from", "or", "are", "an", "but", "not", "have", "you", "they", "we", "can", "one", "all", "when",
    "which", "will", "out", "more", "into", "some", "time", "data", "model", "token", "cache", "batch",
    "queue", "block", "node", "edge", "graph", "value", "delta", "stream", "route", "pool", "layer", "key",
    "map", "set", "list", "row", "file", "disk", "page", "line", "text", "word", "code", "test", "user",
    "plan", "cost", "rate", "load", "peak", "span", "step", "loop", "call", "port", "host", "zone",
)
_OUTPUT_TOKENS = (32, 128)
# Chat template tokens around a message in the simulator's ChatML-like rendering (rounded up).
TEMPLATE_TOKENS = 8


def prompt_text(rng: random.Random, tokens: int) -> str:
    """`tokens` short words: exactly `tokens` prompt tokens for the simulator's tokenizer."""
    return " ".join(rng.choices(_SHORT_WORDS, k=tokens))


def _mean(bounds: tuple[int, int]) -> float:
    return (bounds[0] + bounds[1]) / 2


@dataclass(frozen=True)
class RoutingWorkload:
    """A request generator plus what KV sizing needs to know about it.

    `prefix_working_set_tokens` per pool: the distinct prompt-prefix tokens worth keeping cached (the sum
    over shared prefixes, counted once per LoRA adapter because vLLM keys cached blocks by adapter).
    """

    name: str
    next_spec: Callable[[int], RequestSpec]
    prefix_working_set_tokens: dict[str, int]


def popularity_weights(popularity: str, groups: int) -> list[float]:
    """`uniform`, or `zipf:S`: group i (from 0) is asked with weight 1 / (i + 1)^S."""
    if popularity == "uniform":
        return [1.0] * groups
    kind, _, exponent = popularity.partition(":")
    try:
        s = float(exponent)
    except ValueError:
        s = -1.0
    if kind != "zipf" or s <= 0:
        raise ValueError(f"popularity must be 'uniform' or 'zipf:S' with S > 0, got {popularity!r}")
    return [1.0 / (i + 1) ** s for i in range(groups)]


def shared_prefix_workload(
    model: str, *, pool: str = "chat", seed: int = 0, groups: int = 32, prefix_tokens: tuple[int, int] = (1500, 3000),
    question_tokens: tuple[int, int] = (8, 48), max_tokens: tuple[int, int] = _OUTPUT_TOKENS,
    popularity: str = "uniform", drift_after: int | None = None,
) -> RoutingWorkload:
    """`groups` long system prompts, each followed by many different questions; groups asked with `popularity`.

    A fixed output length (`max_tokens` low == high) is generated exactly (`ignore_eos`). With `drift_after`,
    requests from that index on ask group (rank + groups // 2) % groups where they asked group `rank` before:
    the hot set moves to groups that were cold (label `phase`: `before` / `after`)."""
    weights = popularity_weights(popularity, groups)
    systems: list[str] = []
    for group in range(groups):
        rng = random.Random(seed * 7_919 + group)
        systems.append(f"You are assistant {group}. " + prompt_text(rng, rng.randint(*prefix_tokens)))
    working_set = sum(len(s.split()) + TEMPLATE_TOKENS for s in systems)
    exact = max_tokens[0] == max_tokens[1]
    name = "shared-prefix" if drift_after is None else "drift"

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        group = rng.choices(range(groups), weights)[0]
        labels = {"pool": pool, "model": model}
        if drift_after is not None:
            after = index >= drift_after
            group = (group + groups // 2) % groups if after else group
            labels["phase"] = "after" if after else "before"
        question = prompt_text(rng, rng.randint(*question_tokens)) + "?"
        return chat_spec(model, systems[group], question, stream=True, max_tokens=rng.randint(*max_tokens),
                         labels={**labels, "group": str(group)}, ignore_eos=exact)

    return RoutingWorkload(name, next_spec, {pool: working_set})


@dataclass
class _Conversation:
    number: int
    messages: list[dict[str, str]]
    turns_left: int


class MultiTurnChats:
    """Conversations of `turns` rounds whose history grows, `users` of them at a time per system prompt.

    There are `system_prompts x users` conversation slots, each visited once a round: request i continues
    the conversation of the slot at position i mod slots of its round's order. Every round shuffles the first
    and the second half of the previous round's order separately, so a user's next turn comes between half a
    round and one and a half rounds of the other users later (seconds, at the benchmark's rates: the previous
    answer has arrived, as in a real chat) while who follows whom changes every round, as with independent
    users. Slot s always talks to system prompt s mod system_prompts. (In plain slot order every request of
    system prompt p was followed by one of p + 1: an engine that happened to hold both, prompts 11 and 0 say,
    got its arrivals in pairs ~20 ms apart, two prefills in one step, and a p99 set by that placement lottery
    for every router; the other engines never saw two of their prompts' requests in a row: reports/i15-s24.)
    A conversation that ended is replaced by a new one in its slot; the first conversation of every slot is
    cut at a random turn, so that conversations end (and new ones start) at staggered times from the first
    round on instead of in lockstep.

    Each request replays its conversation so far plus a new question and asks for exactly as many output
    tokens as the answer appended afterwards (`ignore_eos`). The appended answer is synthetic, not what the
    server generated: a server reuses turn n's prompt blocks for turn n+1, not its answer blocks (the answer
    is prefilled with the next question). Specs depend on the order of requests: indices must be asked for
    in increasing order (skipped ones are generated and dropped).
    """

    def __init__(
        self, model: str, *, pool: str = "chat", seed: int = 0, system_prompts: int = 12, users: int = 8,
        turns: tuple[int, int] = (5, 10), system_tokens: tuple[int, int] = (1000, 2000),
        question_tokens: tuple[int, int] = (30, 120), answer_tokens: tuple[int, int] = (50, 150),
    ) -> None:
        if system_prompts < 1 or users < 1 or turns[0] < 1:
            raise ValueError("system_prompts, users and turns must be >= 1")
        self.model, self.pool = model, pool
        self._rng = random.Random(seed)
        self._turns = turns
        self._question_tokens, self._answer_tokens = question_tokens, answer_tokens
        self._systems = [f"You are assistant {i}. " + prompt_text(self._rng, self._rng.randint(*system_tokens))
                         for i in range(system_prompts)]
        self._slots: list[_Conversation | None] = [None] * (system_prompts * users)
        self._order_rng = random.Random(seed * 7_919 + 1)
        self._order = self._shuffled(list(range(len(self._slots))))
        self._started = 0
        self._next_index = 0
        per_turn = _mean(question_tokens) + _mean(answer_tokens) + 2 * TEMPLATE_TOKENS
        # System prompts once, plus every slot's history at its mean length (half its longest).
        self.prefix_working_set_tokens = round(
            sum(len(s.split()) + TEMPLATE_TOKENS for s in self._systems)
            + len(self._slots) * _mean(turns) / 2 * per_turn)

    def _shuffled(self, order: list[int]) -> list[int]:
        """`order`'s first and second halves, each shuffled in place: the next round's order."""
        half = len(order) // 2
        first, second = order[:half], order[half:]
        self._order_rng.shuffle(first)
        self._order_rng.shuffle(second)
        return first + second

    def _new_conversation(self, slot: int) -> _Conversation:
        number = self._started
        self._started += 1
        turns = self._rng.randint(*self._turns)
        if number < len(self._slots):  # the first round: cut at a random turn to stagger the ends
            turns = self._rng.randint(1, turns)
        system = self._systems[slot % len(self._systems)]
        return _Conversation(number, [{"role": "system", "content": system}], turns)

    def _generate(self, index: int) -> RequestSpec:
        rng = self._rng
        position = index % len(self._slots)
        if position == 0 and index > 0:
            self._order = self._shuffled(self._order)
        slot = self._order[position]
        conversation = self._slots[slot]
        if conversation is None or conversation.turns_left == 0:
            conversation = self._slots[slot] = self._new_conversation(slot)
        question = {"role": "user", "content": prompt_text(rng, rng.randint(*self._question_tokens)) + "?"}
        messages = [*conversation.messages, question]
        turn = len(messages) // 2  # 1 for the first question
        answer_tokens = rng.randint(*self._answer_tokens)
        body: dict[str, object] = {"model": self.model, "messages": messages, "max_tokens": answer_tokens,
                                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        answer = {"role": "assistant", "content": prompt_text(rng, answer_tokens)}
        conversation.messages = [*messages, answer]
        conversation.turns_left -= 1
        labels = {"pool": self.pool, "model": self.model, "conversation": str(conversation.number),
                  "user": str(slot), "group": str(slot % len(self._systems)), "turn": str(turn), "api": "chat",
                  "stream": "true"}
        return RequestSpec("POST", "/v1/chat/completions", JSON_HEADERS, json.dumps(body).encode(), True, labels)

    def __call__(self, index: int) -> RequestSpec:
        if index < self._next_index:
            raise ValueError(f"multi-turn specs must be requested in order: {index} after {self._next_index - 1}")
        while self._next_index < index:
            self._generate(self._next_index)
            self._next_index += 1
        self._next_index += 1
        return self._generate(index)


def multi_turn_workload(model: str, *, pool: str = "chat", seed: int = 0, system_prompts: int = 12,
                        users: int = 8) -> RoutingWorkload:
    chats = MultiTurnChats(model, pool=pool, seed=seed, system_prompts=system_prompts, users=users)
    return RoutingWorkload("multi-turn", chats, {pool: chats.prefix_working_set_tokens})


@dataclass(frozen=True)
class MixedPool:
    """One pool of the mixed workload: its model, LoRA adapters and share of the traffic."""

    pool: str
    model: str
    share: float
    adapters: tuple[str, ...] = ()
    documents: int = 16


def mixed_workload(
    pools: Sequence[MixedPool], *, seed: int = 0, long_share: float = 0.4, unique_share: float = 0.1,
    lora_share: float = 0.5, long_tokens: tuple[int, int] = (1500, 3000), short_tokens: tuple[int, int] = (20, 200),
    question_tokens: tuple[int, int] = (8, 48), max_tokens: tuple[int, int] = _OUTPUT_TOKENS,
) -> RoutingWorkload:
    """Long and short prompts, on one pool or several (models); on pools with adapters `lora_share` of requests
    name an adapter. Of the requests, `long_share` put a question after one of the pool's shared documents,
    `unique_share` are long prompts nobody else sends (as long as a document: their prefill cannot be saved),
    the rest are short prompts with no shared prefix beyond a one-line system prompt. Each pool's documents are
    split evenly over its names (base model and adapters), so every cached chain is one (document, name) pair."""
    documents: dict[str, list[str]] = {}
    working_set: dict[str, int] = {}
    for number, target in enumerate(pools):
        rng = random.Random(seed * 7_919 + 104_729 * (number + 1))
        docs = [f"Document {d} for {target.model}. " + prompt_text(rng, rng.randint(*long_tokens))
                for d in range(target.documents)]
        documents[target.pool] = docs
        working_set[target.pool] = sum(len(d.split()) + TEMPLATE_TOKENS for d in docs)
    weights = [p.share for p in pools]

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        target = rng.choices(pools, weights)[0]
        lora = target.adapters and rng.random() < lora_share
        model = rng.choice(target.adapters) if lora else target.model
        names = (target.model, *target.adapters)
        labels = {"pool": target.pool, "model": model, "lora": model if lora else "-"}
        max_out = rng.randint(*max_tokens)
        draw = rng.random()
        if draw < long_share:
            docs = documents[target.pool]
            # Documents are dealt to names round-robin so each document is cached under one name only.
            owned = [d for i, d in enumerate(docs) if names[i % len(names)] == model] or docs
            document = rng.randrange(len(owned))
            question = prompt_text(rng, rng.randint(*question_tokens)) + "?"
            return chat_spec(model, owned[document], question, stream=True, max_tokens=max_out,
                             labels={**labels, "kind": "long", "group": f"{model}/{document}"})
        if draw < long_share + unique_share:
            text = f"Request {index}. " + prompt_text(rng, rng.randint(*long_tokens))
            return chat_spec(model, "You are a helpful assistant.", text, stream=True, max_tokens=max_out,
                             labels={**labels, "kind": "unique", "group": "-"})
        prompt = prompt_text(rng, rng.randint(*short_tokens))
        return chat_spec(model, "You are a helpful assistant.", prompt, stream=True, max_tokens=max_out,
                         labels={**labels, "kind": "short", "group": "-"})

    return RoutingWorkload("mixed", next_spec, working_set)
