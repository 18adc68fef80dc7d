"""Python stubs for the gRPC interop protos, generated at import time.

The protos come from Debian's `grpc-proto` package (/usr/share/grpc-proto), the same files the Swift
side compiles, so both sides speak exactly one contract. Nothing generated is committed: grpcio-tools
writes the modules into a temporary directory that is removed when the process exits.

The generated modules keep their real proto paths (`grpc/testing/test.proto`), so descriptors carry
the same file names the servers report through reflection. Their Python package is `grpc.testing`,
which would collide with grpcio's own `grpc` package; we append the generated `grpc/` folder to
`grpc.__path__` so `grpc.testing` and `grpc.reflection.v1` resolve there (grpcio has neither).
Health and reflection v1alpha stubs come from grpcio-health-checking and grpcio-reflection.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile

import grpc

GRPC_PROTO_DIR = os.environ.get("GRPC_PROTO_DIR", "/usr/share/grpc-proto")

_PROTOS = [
    "grpc/testing/empty.proto",
    "grpc/testing/messages.proto",
    "grpc/testing/test.proto",
    "grpc/reflection/v1/reflection.proto",
]


def _generate() -> str:
    from grpc_tools import protoc  # imported lazily: only needed once per process

    out = tempfile.mkdtemp(prefix="interop-stubs-")
    atexit.register(shutil.rmtree, out, True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto in _PROTOS:
        if not os.path.exists(os.path.join(GRPC_PROTO_DIR, proto)):
            raise RuntimeError(f"{proto} not found under {GRPC_PROTO_DIR} (apt-get install grpc-proto)")
    args = ["protoc", f"-I{GRPC_PROTO_DIR}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + _PROTOS) != 0:
        raise RuntimeError("grpc_tools.protoc failed to generate the interop stubs")
    return out


_out = _generate()
grpc.__path__.append(os.path.join(_out, "grpc"))  # type: ignore[attr-defined]
# grpcio aliases `grpc.reflection` to the grpcio-reflection package when that is installed, so the
# generated `grpc/reflection/v1` folder has to be reachable from that package's path as well.
try:
    _reflection_pkg = importlib.import_module("grpc.reflection")
    _reflection_pkg.__path__.append(os.path.join(_out, "grpc", "reflection"))
except ImportError:
    pass

empty_pb2 = importlib.import_module("grpc.testing.empty_pb2")
messages_pb2 = importlib.import_module("grpc.testing.messages_pb2")
test_pb2 = importlib.import_module("grpc.testing.test_pb2")
test_pb2_grpc = importlib.import_module("grpc.testing.test_pb2_grpc")
reflection_v1_pb2 = importlib.import_module("grpc.reflection.v1.reflection_pb2")
reflection_v1_pb2_grpc = importlib.import_module("grpc.reflection.v1.reflection_pb2_grpc")

TEST_SERVICE = "grpc.testing.TestService"


def status_code(number: int) -> grpc.StatusCode:
    """The grpc.StatusCode for a numeric status code (UNKNOWN for numbers outside the table)."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
