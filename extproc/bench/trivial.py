"""The smallest ext_proc service that does the same gRPC work as ours: `extproc bench overhead`'s baseline.

It answers each message Envoy sends with CONTINUE (the request body's answer sets fixed routing headers and
clears the route cache, as our routing answer does) and drains the access-log stream, so the rendered Envoy
configuration runs unchanged against it. With `--hold-headers` (Envoy's `request_body_mode: prebuffered`, which
sends the body without waiting for the headers' answer) it answers the headers only once the body is in, with the
routing headers, as ours does: the router picks the route at the headers, so a route cache cleared at the body
is refused there (Envoy: "envoy bug failure: !route_cache_blocked_", every request failing).
What it costs per request is what grpc.aio and the event loop cost; what ours costs above it is our own work.

    python -m extproc.bench.trivial --port 9001 --set x-gateway-pool=bench \
        --set x-gateway-destination-endpoint=127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs

_HEADERS = ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse())
_OTHER = {
    "response_headers": ext_pb.ProcessingResponse(response_headers=ext_pb.HeadersResponse()),
    "response_body": ext_pb.ProcessingResponse(response_body=ext_pb.BodyResponse()),
    "request_trailers": ext_pb.ProcessingResponse(request_trailers=ext_pb.TrailersResponse()),
    "response_trailers": ext_pb.ProcessingResponse(response_trailers=ext_pb.TrailersResponse()),
}


def routing(headers: list[tuple[str, str]]) -> ext_pb.CommonResponse:
    return ext_pb.CommonResponse(header_mutation=ext_pb.HeaderMutation(set_headers=[
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))
        for key, value in headers]), clear_route_cache=True)


def answers(headers: list[tuple[str, str]], hold: bool) -> tuple[ext_pb.ProcessingResponse | None,
                                                                   list[ext_pb.ProcessingResponse]]:
    """The answer to the request headers (None: held until the body is in) and the answers to the body."""
    if hold:
        return None, [ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse(response=routing(headers))),
                      ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse())]
    return _HEADERS, [ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=routing(headers)))]


class Continue(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, headers: ext_pb.ProcessingResponse | None, body: list[ext_pb.ProcessingResponse]) -> None:
        self._headers = headers
        self._body = body

    async def Process(self, request_iterator: AsyncIterator[ext_pb.ProcessingRequest],
                      context: grpc.aio.ServicerContext[Any, Any]) -> None:
        while True:
            message = await context.read()
            if message is EOF:
                return
            phase = message.WhichOneof("request")
            if phase == "request_headers":
                if self._headers is not None:
                    await context.write(self._headers)
            elif phase == "request_body":
                for answer in self._body:
                    await context.write(answer)
            elif phase in _OTHER:
                await context.write(_OTHER[phase])


class Drain(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
                               context: grpc.aio.ServicerContext[Any, Any]) -> als_pb2.StreamAccessLogsResponse:
        async for _ in request_iterator:
            pass
        return als_pb2.StreamAccessLogsResponse()


async def serve(port: int, headers: list[tuple[str, str]], hold: bool = False) -> None:
    server = grpc.aio.server()
    ext_grpc.add_ExternalProcessorServicer_to_server(Continue(*answers(headers, hold)), server)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(Drain(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extproc.bench.trivial", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True, help="gRPC port on 127.0.0.1")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a request header the body's answer sets (repeat)")
    parser.add_argument("--hold-headers", action="store_true",
                        help="answer the request headers only with the body (Envoy's prebuffered request body mode)")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    headers = [(name, value) for name, _, value in (item.partition("=") for item in args.set)]
    import uvloop

    uvloop.run(serve(args.port, headers, args.hold_headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
