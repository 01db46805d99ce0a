"""KEDA's side of the external scaler protocol for tests: protoc (grpcio-tools) compiles the vendored
externalscaler.proto into Python modules, as KEDA's own Go client is compiled from the same file."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import extproc.server.keda

PROTO_DIR = Path(extproc.server.keda.__file__).parent
PROTO = PROTO_DIR / "externalscaler.proto"


def compile_proto(out: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", *extra, PROTO.name],
                   check=True, cwd=PROTO_DIR, capture_output=True, text=True, timeout=60)


def client_modules(out: Path) -> tuple[ModuleType, ModuleType]:
    """(externalscaler_pb2, externalscaler_pb2_grpc) generated into `out` and imported."""
    out.mkdir(parents=True, exist_ok=True)
    compile_proto(out, f"--python_out={out}", f"--grpc_python_out={out}")
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("externalscaler_pb2"), importlib.import_module("externalscaler_pb2_grpc")
    finally:
        sys.path.remove(str(out))
