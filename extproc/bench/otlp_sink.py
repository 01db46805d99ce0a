"""An OTLP/gRPC trace receiver for benchmarks (the collector's TraceService from opentelemetry-proto): it accepts
and counts spans, so that a traced variant exports as it would to a real collector.

It runs as its own process (`python -m extproc.bench.otlp_sink --port P --count-file F`, started by
`start_sink`): in the load generator's process its gRPC server and the exports it receives would take the load
generator's event loop during the traced variant's rounds only, and bill their cost to tracing. The count of
spans received is rewritten to the count file after each export."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from extproc.bench.procs import ProcessGroup, wait_port
from extproc.bench.stack import PYTHON, free_ports

__all__ = ["OtlpSink", "spans_received", "start_sink"]


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, count_file: Path | None = None) -> None:
        self.spans = 0
        self._count_file = count_file
        self._server: grpc.aio.Server | None = None

    async def Export(self, request: Any, context: Any) -> Any:
        self.spans += sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        if self._count_file is not None:
            scratch = self._count_file.with_suffix(".tmp")
            scratch.write_text(str(self.spans))
            os.replace(scratch, self._count_file)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self, port: int = 0) -> int:
        """Listen on loopback (`port` 0: a free one); returns the port."""
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        return port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)


async def start_sink(group: ProcessGroup, workdir: Path) -> tuple[int, Path]:
    """A sink process in `group`: its port and count file."""
    port = free_ports(1)[0]
    count_file = workdir / "otlp-spans.txt"
    child = await group.start("otlp-sink", [PYTHON, "-m", "extproc.bench.otlp_sink", "--port", str(port),
                                            "--count-file", str(count_file)])
    await wait_port("127.0.0.1", port, 30, child=child)
    return port, count_file


def spans_received(count_file: Path) -> int:
    try:
        return int(count_file.read_text() or 0)
    except FileNotFoundError:
        return 0


async def _serve(port: int, count_file: Path) -> None:
    sink = OtlpSink(count_file)
    await sink.start(port)
    await asyncio.Event().wait()  # until the bench stops this process


def main() -> None:
    parser = argparse.ArgumentParser(description="OTLP/gRPC span sink for benchmarks (counts spans)")
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--count-file", type=Path, required=True, help="where the count of spans is written")
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.count_file))


if __name__ == "__main__":
    main()
