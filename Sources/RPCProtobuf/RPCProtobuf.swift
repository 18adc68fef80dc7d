// Module RPCProtobuf: see docs/architecture.md
