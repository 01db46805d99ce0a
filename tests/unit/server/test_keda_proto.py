"""The vendored compiled form of KEDA's externalscaler.proto is what protoc makes of the vendored file."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from extproc.server.keda import externalscaler
from tests.keda import PROTO, compile_proto


def test_the_vendored_descriptor_is_protocs_output_for_the_vendored_proto(tmp_path: Path) -> None:
    out = tmp_path / "set.bin"
    compile_proto(tmp_path, f"--descriptor_set_out={out}")
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    vendored = descriptor_pb2.FileDescriptorProto.FromString(externalscaler.FILE_DESCRIPTOR)
    assert vendored == compiled, f"refresh FILE_DESCRIPTOR: {compiled.SerializeToString()!r}"
    assert compiled.package == "externalscaler"
    methods = {m.name for m in compiled.service[0].method}
    assert {"IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"} <= methods


def test_the_proto_and_its_licence_note_ship_with_the_package() -> None:
    notice = (PROTO.parent / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and "kedacore/keda" in notice
    assert PROTO.read_text().startswith('syntax = "proto3";')
