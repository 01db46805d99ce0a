"""Our code's CPU per request on the default-policy path, in process (no gRPC): the messages Envoy sends, through
ExternalProcessorService.Process with a fake context. usage: micro.py N [profile]"""
import asyncio, cProfile, json, pstats, sys, time
from typing import Any
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from grpc.aio import EOF
from prometheus_client import CollectorRegistry
from extproc.config import parse_policy
from extproc.gateway import RuntimeHolder, build_gateway
from extproc.limits.memory import MemoryStore
from extproc.server.processor import ExternalProcessorService
from extproc.telemetry import GatewayMetrics

POLICY = "pools:\n  - {name: bench, model: bench-model, endpoints: ['127.0.0.1:9']}\n"
BODY = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 1}).encode()
HEAD = {":authority": "127.0.0.1:10000", ":path": "/v1/chat/completions", ":method": "POST", ":scheme": "http",
        "content-type": "application/json", "content-length": str(len(BODY)), "x-forwarded-proto": "http",
        "x-request-id": "0b5a3c3e-5d7f-4a43-9d64-0f0c6f7a2f11", "user-agent": "aiohttp", "accept": "*/*",
        "accept-encoding": "gzip, deflate"}
def headers() -> ext_pb.ProcessingRequest:
    m = ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in HEAD.items()])))
    m.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.BUFFERED
    return m
MESSAGES = [headers().SerializeToString(),
            ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=BODY, end_of_stream=True)).SerializeToString()]

class Ctx:
    def __init__(self) -> None:
        self.inbox = [ext_pb.ProcessingRequest.FromString(m) for m in MESSAGES]  # as gRPC deserializes them
        self.out: list[bytes] = []
    async def read(self) -> Any:
        return self.inbox.pop(0) if self.inbox else EOF
    async def write(self, message: ext_pb.ProcessingResponse) -> None:
        self.out.append(message.SerializeToString())  # as gRPC serializes them
    def invocation_metadata(self) -> Any:
        return ()

async def main(n: int, profile: bool) -> None:
    runtimes = RuntimeHolder(parse_policy(POLICY))
    service = ExternalProcessorService(build_gateway(runtimes, GatewayMetrics(CollectorRegistry())).gateway, MemoryStore())
    for _ in range(2000):
        await service.Process(None, Ctx())
    prof = cProfile.Profile() if profile else None
    t0 = time.thread_time()
    if prof: prof.enable()
    for _ in range(n):
        await service.Process(None, Ctx())
    if prof: prof.disable()
    print(f"{(time.thread_time() - t0) / n * 1e6:.1f} us CPU per request (our code, no gRPC){' (profiled)' if prof else ''}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)

asyncio.run(main(int(sys.argv[1]), len(sys.argv) > 2))
