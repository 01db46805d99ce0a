"""grpc.aio servers (ext_proc, health) and admin HTTP; the only package that imports Envoy protos."""

from extproc.server.app import Service, build_service, run

__all__ = ["Service", "build_service", "run"]
