"""Request mixes for the demo and benchmarks: deterministic for a seed, cheap to generate."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.bench.loadgen import RequestSpec

_WORDS = ("gpu", "token", "cache", "prefix", "stream", "latency", "envoy", "router", "batch", "model",
          "tenant", "quota", "replica", "kernel", "memory", "queue", "policy", "canary", "weight", "shard")

JSON_HEADERS = (("content-type", "application/json"),)


def filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass(frozen=True)
class ModelTarget:
    """A model the workload asks for; `names` are the names clients use (served name or aliases)."""

    pool: str
    names: tuple[str, ...]
    weight: float


def chat_spec(model: str, system: str, question: str, *, stream: bool, max_tokens: int,
              labels: dict[str, str], ignore_eos: bool = False) -> RequestSpec:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if ignore_eos:  # vLLM's extension: generate exactly max_tokens
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestSpec("POST", "/v1/chat/completions", JSON_HEADERS, json.dumps(body).encode(), stream,
                       {**labels, "api": "chat", "stream": str(stream).lower()})


def completion_spec(model: str, prompt: str, *, stream: bool, max_tokens: int,
                    labels: dict[str, str]) -> RequestSpec:
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestSpec("POST", "/v1/completions", JSON_HEADERS, json.dumps(body).encode(), stream,
                       {**labels, "api": "completions", "stream": str(stream).lower()})


def demo_mix(targets: Sequence[ModelTarget], seed: int = 0, stream_share: float = 0.7,
             system_prompts: int = 4) -> Callable[[int], RequestSpec]:
    """Mixed chat/completions traffic, streaming and not, a few shared system prompts per model."""
    prompt_rng = random.Random(seed)
    systems = [f"You are assistant #{i}. " + filler(prompt_rng, 120) for i in range(system_prompts)]
    weights = [t.weight for t in targets]

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        target = rng.choices(targets, weights)[0]
        model = rng.choice(target.names)
        stream = rng.random() < stream_share
        max_tokens = rng.randint(16, 160)
        labels = {"pool": target.pool, "model": model}
        if rng.random() < 0.8:
            return chat_spec(model, rng.choice(systems), filler(rng, rng.randint(5, 60)), stream=stream,
                             max_tokens=max_tokens, labels=labels)
        return completion_spec(model, filler(rng, rng.randint(20, 200)), stream=stream, max_tokens=max_tokens,
                               labels=labels)

    return next_spec


# -- routing benchmark workloads ------------------------------------------------------------------
# Prompt text is built from short words: the simulator's tokenizer makes one token of each word (with
# its leading space), so a text of N words is N prompt tokens at ~4.5 characters per token, close to
# what real BPE tokenizers give for English.
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
_TEMPLATE_TOKENS = 8


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
    popularity: str = "uniform",
) -> RoutingWorkload:
    """`groups` long system prompts, each followed by many different questions; groups asked with `popularity`.

    A fixed output length (`max_tokens` low == high) is generated exactly (`ignore_eos`)."""
    weights = popularity_weights(popularity, groups)
    systems: list[str] = []
    for group in range(groups):
        rng = random.Random(seed * 7_919 + group)
        systems.append(f"You are assistant {group}. " + prompt_text(rng, rng.randint(*prefix_tokens)))
    working_set = sum(len(s.split()) + _TEMPLATE_TOKENS for s in systems)
    exact = max_tokens[0] == max_tokens[1]

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        group = rng.choices(range(groups), weights)[0]
        question = prompt_text(rng, rng.randint(*question_tokens)) + "?"
        return chat_spec(model, systems[group], question, stream=True, max_tokens=rng.randint(*max_tokens),
                         labels={"pool": pool, "model": model, "group": str(group)}, ignore_eos=exact)

    return RoutingWorkload("shared-prefix", next_spec, {pool: working_set})


@dataclass
class _Conversation:
    number: int
    messages: list[dict[str, str]]
    turns_left: int


class MultiTurnChats:
    """Many concurrent conversations; each request replays its conversation so far plus a new question.

    After each request the generator appends the question and a synthetic answer to that conversation, so
    turn n+1's prompt text starts with turn n's prompt text. The synthetic answer is not what the server
    generated, so a server can reuse turn n's prompt blocks but not its answer blocks. Specs depend on the
    order of requests: indices must be asked for in increasing order (skipped ones are generated and dropped).
    """

    def __init__(
        self, model: str, *, pool: str = "chat", seed: int = 0, conversations: int = 32,
        turns: tuple[int, int] = (3, 8), system_tokens: tuple[int, int] = (200, 600),
        question_tokens: tuple[int, int] = (8, 48), answer_tokens: tuple[int, int] = (32, 128),
        max_tokens: tuple[int, int] = _OUTPUT_TOKENS,
    ) -> None:
        self.model, self.pool = model, pool
        self._rng = random.Random(seed)
        self._turns, self._system_tokens = turns, system_tokens
        self._question_tokens, self._answer_tokens, self._max_tokens = question_tokens, answer_tokens, max_tokens
        self._slots: list[_Conversation | None] = [None] * conversations
        self._started = 0
        self._next_index = 0
        per_turn = _mean(question_tokens) + _mean(answer_tokens) + 2 * _TEMPLATE_TOKENS
        # Every slot's conversation at its longest: an upper bound of the history tokens worth caching.
        self.prefix_working_set_tokens = round(
            conversations * (_mean(system_tokens) + _TEMPLATE_TOKENS + _mean(turns) * per_turn))

    def _new_conversation(self) -> _Conversation:
        number = self._started
        self._started += 1
        length = self._rng.randint(*self._system_tokens)
        system = f"You are assistant for chat {number}. " + prompt_text(self._rng, length)
        return _Conversation(number, [{"role": "system", "content": system}], self._rng.randint(*self._turns))

    def _generate(self) -> RequestSpec:
        rng = self._rng
        slot = rng.randrange(len(self._slots))
        conversation = self._slots[slot]
        if conversation is None or conversation.turns_left == 0:
            conversation = self._slots[slot] = self._new_conversation()
        question = {"role": "user", "content": prompt_text(rng, rng.randint(*self._question_tokens)) + "?"}
        messages = [*conversation.messages, question]
        turn = len(messages) // 2  # 1 for the first question
        body: dict[str, object] = {"model": self.model, "messages": messages,
                                   "max_tokens": rng.randint(*self._max_tokens), "stream": True,
                                   "stream_options": {"include_usage": True}}
        answer = {"role": "assistant", "content": prompt_text(rng, rng.randint(*self._answer_tokens)) + "."}
        conversation.messages = [*messages, answer]
        conversation.turns_left -= 1
        labels = {"pool": self.pool, "model": self.model, "conversation": str(conversation.number),
                  "turn": str(turn), "api": "chat", "stream": "true"}
        return RequestSpec("POST", "/v1/chat/completions", JSON_HEADERS, json.dumps(body).encode(), True, labels)

    def __call__(self, index: int) -> RequestSpec:
        if index < self._next_index:
            raise ValueError(f"multi-turn specs must be requested in order: {index} after {self._next_index - 1}")
        while self._next_index < index:
            self._generate()
            self._next_index += 1
        self._next_index += 1
        return self._generate()


def multi_turn_workload(model: str, *, pool: str = "chat", seed: int = 0, conversations: int = 32) -> RoutingWorkload:
    chats = MultiTurnChats(model, pool=pool, seed=seed, conversations=conversations)
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
    pools: Sequence[MixedPool], *, seed: int = 0, long_share: float = 0.5, lora_share: float = 0.5,
    long_tokens: tuple[int, int] = (1500, 3000), short_tokens: tuple[int, int] = (20, 200),
    question_tokens: tuple[int, int] = (8, 48), max_tokens: tuple[int, int] = _OUTPUT_TOKENS,
) -> RoutingWorkload:
    """Several models; on pools with adapters `lora_share` of requests name an adapter. Long requests put a
    question after one of the pool's shared documents; short ones are unique prompts with no shared prefix.
    Each pool's documents are split evenly over its names (base model and adapters), so every cached
    chain is one (document, name) pair."""
    documents: dict[str, list[str]] = {}
    working_set: dict[str, int] = {}
    for number, target in enumerate(pools):
        rng = random.Random(seed * 7_919 + 104_729 * (number + 1))
        docs = [f"Document {d} for {target.model}. " + prompt_text(rng, rng.randint(*long_tokens))
                for d in range(target.documents)]
        documents[target.pool] = docs
        working_set[target.pool] = sum(len(d.split()) + _TEMPLATE_TOKENS for d in docs)
    weights = [p.share for p in pools]

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        target = rng.choices(pools, weights)[0]
        lora = target.adapters and rng.random() < lora_share
        model = rng.choice(target.adapters) if lora else target.model
        names = (target.model, *target.adapters)
        labels = {"pool": target.pool, "model": model, "lora": model if lora else "-"}
        max_out = rng.randint(*max_tokens)
        if rng.random() < long_share:
            docs = documents[target.pool]
            # Documents are dealt to names round-robin so each document is cached under one name only.
            owned = [d for i, d in enumerate(docs) if names[i % len(names)] == model] or docs
            document = rng.randrange(len(owned))
            question = prompt_text(rng, rng.randint(*question_tokens)) + "?"
            return chat_spec(model, owned[document], question, stream=True, max_tokens=max_out,
                             labels={**labels, "kind": "long", "group": f"{model}/{document}"})
        prompt = prompt_text(rng, rng.randint(*short_tokens))
        return chat_spec(model, "You are a helpful assistant.", prompt, stream=True, max_tokens=max_out,
                         labels={**labels, "kind": "short", "group": "-"})

    return RoutingWorkload("mixed", next_spec, working_set)
