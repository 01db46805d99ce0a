"""Stage timings of the harness's requests without cProfile's per-call overhead: chosen functions wrapped with a
perf_counter accumulator (nested stages include their children). Usage: python stages.py [N]"""
from __future__ import annotations

import collections
import functools
import importlib
import runpy
import sys
import time

TOTALS: collections.Counter[str] = collections.Counter()
COUNTS: collections.Counter[str] = collections.Counter()


def wrap(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - started
            COUNTS[label] += 1

    setattr(owner, name, timed)


resolve = importlib.import_module("extproc.gateway.resolve")
schedule = importlib.import_module("extproc.gateway.schedule")
protocol = importlib.import_module("extproc.server.protocol")
processor = importlib.import_module("extproc.server.processor")
framework = importlib.import_module("extproc.scheduling.framework")
decision = importlib.import_module("extproc.gateway.decision")
prefix = importlib.import_module("extproc.scheduling.prefix")
wrap(resolve, "decode_json", "resolve.decode_json")
wrap(resolve, "parse_document", "resolve.parse_document")
wrap(resolve.Resolve, "__call__", "Resolve (all)")
wrap(schedule.Schedule, "request", "Schedule.request (incl chains)")
wrap(prefix.PrefixChains, "__call__", "PrefixChains")
wrap(schedule.Schedule, "__call__", "Schedule (all)")
wrap(schedule.Schedule, "_candidates", "Schedule._candidates")
wrap(framework.Profile, "schedule", "Profile.schedule")
wrap(framework.Profile, "observe", "Profile.observe")
wrap(protocol, "held_headers_response", "protocol.held_headers_response")
wrap(protocol, "request_head", "protocol.request_head")
wrap(decision.Gateway, "headers", "Gateway.headers")
wrap(decision.Gateway, "finish", "Gateway.finish")
wrap(processor.StreamProcessor, "respond", "StreamProcessor.respond")
wrap(processor.StreamProcessor, "_request_body", "StreamProcessor._request_body")
wrap(processor.StreamProcessor, "_request_headers", "StreamProcessor._request_headers")
from extproc.scheduling import plugins  # noqa: E402
for modname in ("prefix_affinity", "queue_depth", "kv_utilization", "inflight", "latency", "lora_affinity",
                "saturation", "session_affinity", "pickers"):
    module = importlib.import_module(f"extproc.scheduling.plugins.{modname}")
    for cls in vars(module).values():
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            for method in ("score", "filter", "pick", "observe"):
                if method in vars(cls):
                    wrap(cls, method, f"{cls.__name__}.{method}")

n = sys.argv[1] if len(sys.argv) > 1 else "3000"
sys.argv = ["harness", "time", n]
runpy.run_path(str(__import__("pathlib").Path(__file__).with_name("harness.py")), run_name="__main__")
warm = 300
for label, total in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
    print(f"{total / (COUNTS[label]) * 1e6:8.1f} us/call {COUNTS[label]:7d} calls  {label}")
