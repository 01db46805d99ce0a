"""The `agents` routing workload: coding-agent sessions as Claude Code and the OpenAI Agents SDK send them.

Half the sessions speak Anthropic Messages (`/v1/messages`) the way Claude Code does: a long system prompt shared
by every session of that agent, preceded by Claude Code's `x-anthropic-billing-header` block, whose hash changes
on every request (vLLM drops it from the prompt, and so must prefix affinity); a list of tools with JSON
schemas; turns of `tool_use` / `tool_result` blocks; now and then a screenshot (an image block). The other half
speak the Responses API (`/v1/responses`) as an Agents SDK runner does: `instructions`, function tools, and the
whole history as input items (messages, `function_call`, `function_call_output`). Each request replays its
session so far plus a new step, so turn n+1 starts with turn n's prompt; prefix affinity should find it as well
as on the chat `multi-turn` workload.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any

from extproc.bench.loadgen import RequestSpec
from extproc.bench.routing_workloads import MultiTurnChats, RoutingWorkload, prompt_text
from extproc.bench.workloads import JSON_HEADERS

__all__ = ["AgentSessions", "AgentsAndChats", "agents_and_chats_workload", "agents_workload"]

_AGENTS = 4  # distinct agent definitions (system prompt + tools), shared by their sessions
_TEMPLATE_TOKENS = 8
_PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


@dataclass
class _Session:
    number: int
    anthropic: bool
    agent: int
    steps: list[tuple[str, str]] = field(default_factory=list)  # (kind, text): user / call / result / answer
    steps_left: int = 0
    images: int = 0


class AgentSessions:
    """Concurrent agent sessions; like the chat multi-turn workload, indices must be asked for in order."""

    def __init__(self, model: str, *, pool: str = "chat", seed: int = 0, sessions: int = 32,
                 steps: tuple[int, int] = (3, 8), system_tokens: tuple[int, int] = (1200, 2400),
                 step_tokens: tuple[int, int] = (16, 96), max_tokens: tuple[int, int] = (32, 128),
                 image_share: float = 0.1) -> None:
        self.model, self.pool = model, pool
        self._rng = random.Random(seed)
        self._steps, self._step_tokens, self._max_tokens = steps, step_tokens, max_tokens
        self._image_share = image_share
        setup = random.Random(seed * 7_919 + 17)
        self._systems = [f"You are coding agent {a}. " + prompt_text(setup, setup.randint(*system_tokens))
                         for a in range(_AGENTS)]
        self._tools = [[{"name": f"tool_{a}_{t}", "description": prompt_text(setup, 40),
                         "schema": {"type": "object", "properties": {"arg": {"type": "string",
                                                                             "description": prompt_text(setup, 12)}}}}
                        for t in range(6)] for a in range(_AGENTS)]
        self._slots: list[_Session | None] = [None] * sessions
        self._started = 0
        self._next_index = 0
        per_step = 2 * (sum(step_tokens) / 2 + _TEMPLATE_TOKENS)
        self.prefix_working_set_tokens = round(
            _AGENTS * sum(system_tokens) / 2 + sessions * sum(steps) / 2 * per_step)

    def _new_session(self) -> _Session:
        number = self._started
        self._started += 1
        rng = self._rng
        return _Session(number, anthropic=number % 2 == 0, agent=rng.randrange(_AGENTS),
                        steps_left=rng.randint(*self._steps))

    def _messages_body(self, session: _Session, max_tokens: int) -> dict[str, Any]:
        billing = f"x-anthropic-billing-header: cc_version=2.1.0; cch={self._rng.getrandbits(64):016x};"
        messages: list[dict[str, Any]] = []
        for index, (kind, text) in enumerate(session.steps):
            if kind == "user":
                content: list[dict[str, Any]] = [{"type": "text", "text": text}]
                if index < session.images * 2:  # the first steps of a session with screenshots carry one
                    content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                "data": _PIXEL}})
                messages.append({"role": "user", "content": content})
            elif kind == "call":
                messages.append({"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": f"toolu_{session.number}_{index}", "name": f"tool_{session.agent}_0",
                     "input": {"arg": text}}]})
            else:  # the tool's result answers the call before it
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{session.number}_{index - 1}", "content": text}]})
        tools = [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]}
                 for t in self._tools[session.agent]]
        return {"model": self.model, "max_tokens": max_tokens, "stream": True, "tools": tools,
                "system": [{"type": "text", "text": billing}, {"type": "text", "text": self._systems[session.agent]}],
                "messages": messages}

    def _responses_body(self, session: _Session, max_tokens: int) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for index, (kind, text) in enumerate(session.steps):
            call_id = f"call_{session.number}_{index - (kind == 'result')}"
            if kind == "user":
                items.append({"role": "user", "content": [{"type": "input_text", "text": text}]})
            elif kind == "call":
                items.append({"type": "function_call", "call_id": call_id, "name": f"tool_{session.agent}_0",
                              "arguments": json.dumps({"arg": text})})
            else:
                items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        tools = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["schema"]}
                 for t in self._tools[session.agent]]
        return {"model": self.model, "max_output_tokens": max_tokens, "stream": True, "store": False,
                "instructions": self._systems[session.agent], "tools": tools, "input": items}

    def _generate(self) -> RequestSpec:
        rng = self._rng
        slot = rng.randrange(len(self._slots))
        session = self._slots[slot]
        if session is None or session.steps_left == 0:
            session = self._slots[slot] = self._new_session()
            session.images = 1 if session.anthropic and rng.random() < self._image_share else 0
        if session.steps and session.steps[-1][0] == "call":  # the tool ran: its result, then the next step
            session.steps.append(("result", prompt_text(rng, rng.randint(*self._step_tokens))))
        else:
            session.steps.append(("user", prompt_text(rng, rng.randint(*self._step_tokens)) + "?"))
        max_tokens = rng.randint(*self._max_tokens)
        body = (self._messages_body if session.anthropic else self._responses_body)(session, max_tokens)
        # What the model "answered": a tool call (the engine's own text is not replayed, as in multi-turn).
        session.steps.append(("call", prompt_text(rng, rng.randint(4, 12))))
        session.steps_left -= 1
        api = "messages" if session.anthropic else "responses"
        labels = {"pool": self.pool, "model": self.model, "conversation": str(session.number),
                  "turn": str(len(session.steps) // 2), "api": api, "stream": "true"}
        return RequestSpec("POST", f"/v1/{api}", JSON_HEADERS, json.dumps(body).encode(), True, labels)

    def __call__(self, index: int) -> RequestSpec:
        if index < self._next_index:
            raise ValueError(f"agent specs must be requested in order: {index} after {self._next_index - 1}")
        while self._next_index < index:
            self._generate()
            self._next_index += 1
        self._next_index += 1
        return self._generate()


def agents_workload(model: str, *, pool: str = "chat", seed: int = 0, sessions: int = 32) -> RoutingWorkload:
    agents = AgentSessions(model, pool=pool, seed=seed, sessions=sessions)
    return RoutingWorkload("agents", agents, {pool: agents.prefix_working_set_tokens})


class AgentsAndChats:
    """The `agents+chat` workload: the chat `multi-turn` conversations (even requests) and the agent sessions
    (odd ones) on one fleet at once, each generator fed its own indices in order; every spec is labelled with
    its `workload`, so that hit rates per workload compare the two under the same load, KV and routing."""

    def __init__(self, model: str, *, pool: str = "chat", seed: int = 0) -> None:
        self.chats = MultiTurnChats(model, pool=pool, seed=seed)
        self.agents = AgentSessions(model, pool=pool, seed=seed)

    def __call__(self, index: int) -> RequestSpec:
        agent = index % 2 == 1
        spec = self.agents(index // 2) if agent else self.chats(index // 2)
        return dataclasses.replace(spec, labels={**spec.labels, "workload": "agents" if agent else "chat"})


def agents_and_chats_workload(model: str, *, pool: str = "chat", seed: int = 0) -> RoutingWorkload:
    both = AgentsAndChats(model, pool=pool, seed=seed)
    return RoutingWorkload("agents+chat", both, {pool: both.chats.prefix_working_set_tokens
                                                 + both.agents.prefix_working_set_tokens})
