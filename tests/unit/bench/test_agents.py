"""The agents workload (extproc/bench/agents.py): Claude-Code-shaped Messages and Agents-SDK-shaped Responses
sessions that the gateway parses, whose every turn extends the previous turn's prompt as the engine sees it."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

from extproc.bench.agents import AgentSessions
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
