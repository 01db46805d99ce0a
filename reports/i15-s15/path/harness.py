"""Micro-harness: drive StreamProcessor through prebuffered requests (headers+body, then stream end), 8 endpoints.

Usage: .venv/bin/python reports/i15-s15/path/harness.py [profile|time] [N]
"""
from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from prometheus_client import CollectorRegistry

from extproc.config import parse_policy
from extproc.gateway import RuntimeHolder, build_gateway
from extproc.server.processor import StreamProcessor
from extproc.telemetry import GatewayMetrics

EPS = ", ".join(f'"10.0.0.{i}:8000"' for i in range(1, 9))
POLICY = f"""\
pools:
  - name: chat
    model: org/chat
    endpoints: [{EPS}]
"""
PROSE = ("The Q3 2025 report covers revenue (up 12.5% to 4.2 million), churn and the roadmap for releases "
         "7.1 and 7.2 due 2025-11-30; questions go to finance.team@example.com before Friday. ")
SYSTEMS = [f"group {g}: " + (PROSE * 80)[:12000] for g in range(48)]


def body(i: int) -> bytes:
    msgs = [{"role": "system", "content": SYSTEMS[i % 48]}, {"role": "user", "content": f"{i}: " + PROSE * 6}]
    return json.dumps({"model": "org/chat", "messages": msgs, "max_tokens": 100}).encode()


def head(b: bytes) -> ext_pb.ProcessingRequest:
    pairs = {":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", ":scheme": "http",
             "content-type": "application/json", "content-length": str(len(b)), "x-request-id": "abc"}
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return ext_pb.ProcessingRequest(
        request_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values)),
        protocol_config=ext_pb.ProtocolConfiguration(request_body_mode=1, response_body_mode=0,
                                                     send_body_without_waiting_for_header_response=True))


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "time"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    runtimes = RuntimeHolder(parse_policy(POLICY))
    gateway = build_gateway(runtimes, GatewayMetrics(CollectorRegistry())).gateway
    bodies = [body(i) for i in range(n + 300)]  # every question new, as in issue 15's workloads
    msgs = [(head(b), ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=b, end_of_stream=True)))
            for b in bodies]
    sample = None
    cpu = time.thread_time
    t_head = t_body = t_end = 0.0

    def one(i: int) -> None:
        nonlocal sample, t_head, t_body, t_end
        h, b = msgs[i % len(msgs)]
        s = StreamProcessor(gateway)
        t0 = cpu()
        r1 = s.handle(h, h.WhichOneof("request"))
        t1 = cpu()
        r2 = s.handle(b, b.WhichOneof("request"))
        t2 = cpu()
        assert r1 is None and isinstance(r2, tuple), (r1, r2)
        if s.exchange is not None:
            gateway.finish(s.exchange)
        t3 = cpu()
        t_head += t1 - t0
        t_body += t2 - t1
        t_end += t3 - t2
        if sample is None:
            sample = r2

    for i in range(300):
        one(i)
    t_head = t_body = t_end = 0.0
    if mode == "profile":
        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            one(i)
        prof.disable()
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(40)
        st.sort_stats("cumulative").print_stats(60)
    else:
        for i in range(n):
            one(i)
        print(f"headers {t_head / n * 1e6:.1f} us  body {t_body / n * 1e6:.1f} us  end {t_end / n * 1e6:.1f} us  "
              f"total {(t_head + t_body + t_end) / n * 1e6:.1f} us  (n={n}, body {len(bodies[0])} B)")
    if mode == "dump":
        print(sample)


if __name__ == "__main__":
    main()
