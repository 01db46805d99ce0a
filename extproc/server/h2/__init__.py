"""The lean gRPC front end (the default) for every method of the service's gRPC port: HTTP/2 on asyncio's
Protocol callbacks, one thread, no grpc core (`service.front_end: lean`; README "Front ends")."""

from extproc.server.h2.server import LeanServer

__all__ = ["LeanServer"]
