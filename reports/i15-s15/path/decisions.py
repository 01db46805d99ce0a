"""The routing decisions of the harness's request stream (8 endpoints, 3,000 new questions over 48 system prompts,
in-flight leases held for 40 requests so that load varies; a virtual clock), as a digest of every reply: run it with PYTHONPATH on
each commit's copy and compare. Not a timing: no lock needed. Usage: PYTHONPATH=DIR python decisions.py"""
from __future__ import annotations

import hashlib
import itertools
import importlib.util
import sys
from pathlib import Path

import extproc

spec = importlib.util.spec_from_file_location("harness", Path(__file__).with_name("harness.py"))
assert spec is not None and spec.loader is not None
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)

from prometheus_client import CollectorRegistry  # noqa: E402

from extproc.config import parse_policy  # noqa: E402
from extproc.gateway import RuntimeHolder, build_gateway  # noqa: E402
from extproc.server.processor import StreamProcessor  # noqa: E402
from extproc.telemetry import GatewayMetrics  # noqa: E402

runtimes = RuntimeHolder(parse_policy(harness.POLICY))
ticks = itertools.count(1000.0, 0.0005)  # a virtual clock: 0.5 ms per reading, the same readings on both sides
gateway = build_gateway(runtimes, GatewayMetrics(CollectorRegistry()), clock=lambda: next(ticks),
                        wall_clock=lambda: 1.7e9, replica_id="r").gateway
digest = hashlib.sha256()
open_streams: list[StreamProcessor] = []
picks: dict[str, int] = {}
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3000):
    body = harness.body(i if i % 5 else i // 5)  # some chains repeated exactly
    head = harness.head(body)
    stream = StreamProcessor(gateway)
    stream.handle(head, "request_headers")
    reply = stream.handle(harness.ext_pb.ProcessingRequest(request_body=harness.ext_pb.HttpBody(
        body=body, end_of_stream=True)), "request_body")
    assert isinstance(reply, tuple)
    headers = reply[0].request_headers.response.header_mutation.set_headers
    destination = [h.header.raw_value.decode() for h in headers if h.header.key.endswith("destination-endpoint")][0]
    picks[destination.split(",")[0]] = picks.get(destination.split(",")[0], 0) + 1
    digest.update(b"".join(r.SerializeToString(deterministic=True) for r in reply).replace(
        b"-" + str(i + 1).encode(), b""))  # request ids carry a per-process prefix
    open_streams.append(stream)
    if len(open_streams) > 40:
        done = open_streams.pop(0)
        assert done.exchange is not None
        gateway.finish(done.exchange)
print(extproc.__file__, digest.hexdigest()[:16], sorted(picks.items()))
