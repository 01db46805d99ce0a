"""KEDA's external scaler protocol (`externalscaler.ExternalScaler`), from the vendored `externalscaler.proto`.

`externalscaler.proto` is KEDA's file as published (github.com/kedacore/keda, pkg/scalers/externalscaler/,
commit 82ac584704fc7e12efc5140a7c70a716186630a7; Apache-2.0, see NOTICE in this directory). Below is its compiled
form, the `FileDescriptorProto` protoc makes of it, vendored instead of protoc's Python module: that module pins
the protobuf runtime to protoc's own version (7.35 for grpcio-tools 1.85), while this descriptor loads on any
protobuf the service supports, and the service needs no code generator at build or install time. The message
classes are built from it at import, in a pool of their own. `tests/unit/server/test_keda_proto.py` compiles the
.proto with grpcio-tools (a dev dependency) and fails if this copy differs; to refresh it: replace the .proto, run
`python -m grpc_tools.protoc -I. --descriptor_set_out=/tmp/set externalscaler.proto` here and paste the file's
one `FileDescriptorProto` (the test prints it).
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pool, message_factory

__all__ = ["FILE_DESCRIPTOR", "SERVICE", "GetMetricSpecResponse", "GetMetricsRequest", "GetMetricsResponse",
           "IsActiveResponse", "MetricSpec", "MetricValue", "ScaledObjectRef"]

SERVICE: Final = "externalscaler.ExternalScaler"
FILE_DESCRIPTOR: Final = (
    b'\n\x14externalscaler.proto\x12\x0eexternalscaler"\xe3'
    b'\x01\n\x0fScaledObjectRef\x12\x12\n\x04name\x18\x01 \x01(\tR\x04name\x12\x1c'
    b'\n\tnamespace\x18\x02 \x01(\tR\tnamespace\x12[\n\x0escalerMe'
    b'tadata\x18\x03 \x03(\x0b23.externalscaler.ScaledObje'
    b'ctRef.ScalerMetadataEntryR\x0escalerMetadat'
    b'a\x1aA\n\x13ScalerMetadataEntry\x12\x10\n\x03key\x18\x01 \x01(\tR\x03k'
    b'ey\x12\x14\n\x05value\x18\x02 \x01(\tR\x05value:\x028\x01"*\n\x10IsActive'
    b'Response\x12\x16\n\x06result\x18\x01 \x01(\x08R\x06result"U\n\x15GetM'
    b'etricSpecResponse\x12<\n\x0bmetricSpecs\x18\x01 \x03(\x0b2\x1a'
    b'.externalscaler.MetricSpecR\x0bmetricSpecs"'
    b'v\n\nMetricSpec\x12\x1e\n\nmetricName\x18\x01 \x01(\tR\nmetri'
    b'cName\x12\x1e\n\ntargetSize\x18\x02 \x01(\x03R\ntargetSize\x12(\n'
    b'\x0ftargetSizeFloat\x18\x03 \x01(\x01R\x0ftargetSizeFloat"'
    b'~\n\x11GetMetricsRequest\x12I\n\x0fscaledObjectRef\x18'
    b'\x01 \x01(\x0b2\x1f.externalscaler.ScaledObjectRefR\x0f'
    b'scaledObjectRef\x12\x1e\n\nmetricName\x18\x02 \x01(\tR\nmet'
    b'ricName"U\n\x12GetMetricsResponse\x12?\n\x0cmetricV'
    b'alues\x18\x01 \x03(\x0b2\x1b.externalscaler.MetricValue'
    b'R\x0cmetricValues"{\n\x0bMetricValue\x12\x1e\n\nmetricN'
    b'ame\x18\x01 \x01(\tR\nmetricName\x12 \n\x0bmetricValue\x18\x02 \x01'
    b'(\x03R\x0bmetricValue\x12*\n\x10metricValueFloat\x18\x03 \x01('
    b'\x01R\x10metricValueFloat2\xcc\x03\n\x0eExternalScaler\x12O'
    b'\n\x08IsActive\x12\x1f.externalscaler.ScaledObject'
    b'Ref\x1a .externalscaler.IsActiveResponse"\x00\x12'
    b'W\n\x0eStreamIsActive\x12\x1f.externalscaler.Scale'
    b'dObjectRef\x1a .externalscaler.IsActiveResp'
    b'onse"\x000\x01\x12Y\n\rGetMetricSpec\x12\x1f.externalscal'
    b'er.ScaledObjectRef\x1a%.externalscaler.GetM'
    b'etricSpecResponse"\x00\x12U\n\nGetMetrics\x12!.exte'
    b'rnalscaler.GetMetricsRequest\x1a".externals'
    b'caler.GetMetricsResponse"\x00\x12^\n\x10StreamMetr'
    b'icSpec\x12\x1f.externalscaler.ScaledObjectRef\x1a'
    b'%.externalscaler.GetMetricSpecResponse"\x00'
    b'0\x01B\x12Z\x10.;externalscalerb\x06proto3'
)

_pool = descriptor_pool.DescriptorPool()
_pool.AddSerializedFile(FILE_DESCRIPTOR)
_classes = message_factory.GetMessageClassesForFiles(["externalscaler.proto"], _pool)

ScaledObjectRef: Any = _classes["externalscaler.ScaledObjectRef"]
IsActiveResponse: Any = _classes["externalscaler.IsActiveResponse"]
GetMetricSpecResponse: Any = _classes["externalscaler.GetMetricSpecResponse"]
MetricSpec: Any = _classes["externalscaler.MetricSpec"]
GetMetricsRequest: Any = _classes["externalscaler.GetMetricsRequest"]
GetMetricsResponse: Any = _classes["externalscaler.GetMetricsResponse"]
MetricValue: Any = _classes["externalscaler.MetricValue"]
