# usage (from the worktree): .venv/bin/python reports/i15-s11/inproc_profile.py [SORT [N]]  (SORT: a cProfile sort key; "" = none, N requests)
"""In-process profile of the service's per-request work on the routing bench's request shape."""
import asyncio, cProfile, pstats, sys, time
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from grpc.aio import EOF
from prometheus_client import CollectorRegistry
from extproc.config import parse_policy
from extproc.gateway import RuntimeHolder, build_gateway
from extproc.limits.memory import MemoryStore
from extproc.server.processor import ExternalProcessorService
from extproc.telemetry import GatewayMetrics
from extproc.bench.routing_workloads import shared_prefix_workload

eps = ", ".join(f'"127.0.0.1:{9000+i}"' for i in range(8))
POLICY = f"""
pools:
  - name: chat
    model: org/chat
    aliases: [chat]
    profile: default
    endpoints: [{eps}]
"""
wl = shared_prefix_workload("chat", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100))
specs = [wl.next_spec(i) for i in range(3000)]
print("body bytes", len(specs[0].body))

class Ctx:
    def __init__(self, msgs): self.inbox = msgs; self.n = 0
    async def read(self):
        if self.n < len(self.inbox):
            self.n += 1; return self.inbox[self.n - 1]
        return EOF
    async def write(self, m): m.SerializeToString()
    def invocation_metadata(self): return ()

def msgs(spec):
    hs = [(":method", spec.method), (":path", spec.path), (":authority", "x"), ("content-type", "application/json"),
          ("content-length", str(len(spec.body)))] + list(spec.headers)
    h = ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs])))
    b = ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=spec.body, end_of_stream=True))
    return [ext_pb.ProcessingRequest.FromString(h.SerializeToString()), ext_pb.ProcessingRequest.FromString(b.SerializeToString())]

runtimes = RuntimeHolder(parse_policy(POLICY))
svc = ExternalProcessorService(build_gateway(runtimes, GatewayMetrics(CollectorRegistry())).gateway, MemoryStore())
all_msgs = [msgs(s) for s in specs]
async def main(n):
    for m in all_msgs[:n]:
        await svc.Process(None, Ctx(m))
asyncio.run(main(300))
t = time.thread_time(); asyncio.run(main(int(sys.argv[2]) if len(sys.argv) > 2 else 3000)); dt = time.thread_time() - t
print(f"{dt/3000*1e6:.0f} us/request (processor only, incl. protobuf serialize of replies)")
if len(sys.argv) > 1:
    pr = cProfile.Profile(); pr.enable(); asyncio.run(main(3000)); pr.disable()
    pstats.Stats(pr).sort_stats(sys.argv[1]).print_stats(35)
