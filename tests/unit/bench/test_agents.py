"""The agents workload (extproc/bench/agents.py): Claude-Code-shaped Messages and Agents-SDK-shaped Responses
sessions that the gateway parses, whose every turn extends the previous turn's prompt as the engine sees it."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

from extproc.bench.agents import AgentsAndChats, AgentSessions
from extproc.openai import Api, parse_request
from extproc.scheduling import prefix_blocks


def test_sessions_are_valid_requests_whose_prompts_grow_turn_by_turn() -> None:
    sessions = AgentSessions("m", seed=3, sessions=6)
    prompts: dict[str, list[str]] = defaultdict(list)
    apis = set()
    billing = set()
    for index in range(120):
        spec = sessions(index)
        api = Api.MESSAGES if spec.path == "/v1/messages" else Api.RESPONSES
        apis.add(api)
        body = json.loads(spec.body)
        request = parse_request(api, spec.body, max_bytes=10**7, max_depth=32)
        assert request.stream and request.max_output_tokens is not None
        assert request.extra_prompt_chars > 500  # the tools' schemas count
        if api is Api.MESSAGES:
            billing.add(body["system"][0]["text"])
        prompts[spec.labels["conversation"]].append(request.prompt_text)
    assert apis == {Api.MESSAGES, Api.RESPONSES}
    assert len(billing) > 50  # Claude Code's per-request hash changes every time...
    grew = 0
    for turns in prompts.values():
        for before, after in itertools.pairwise(turns):
            assert after.startswith(before)  # ...yet what prefix affinity hashes extends the previous turn
            assert set(prefix_blocks(before)) <= set(prefix_blocks(after))
            grew += 1
    assert grew > 40


def test_agents_and_chats_interleave_both_workloads_labelled() -> None:
    both = AgentsAndChats("m", seed=2)
    alone = AgentSessions("m", seed=2)
    specs = [both(index) for index in range(40)]
    assert [s.labels["workload"] for s in specs[:4]] == ["chat", "agents", "chat", "agents"]
    assert {s.path for s in specs[::2]} == {"/v1/chat/completions"}
    # The agents half is the agents workload itself, fed its own indices in order (bodies differ only in the
    # billing header's random hash, drawn from the same seeded generator: identical).
    assert [s.body for s in specs[1::2]] == [alone(index).body for index in range(20)]
