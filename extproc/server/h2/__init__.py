"""A lean gRPC front end for the ext_proc and access-log streams: HTTP/2 on asyncio's Protocol callbacks, one
thread, no grpc core (`service.front_end: lean`; README "Front ends")."""

from extproc.server.h2.server import LeanServer

__all__ = ["LeanServer"]
