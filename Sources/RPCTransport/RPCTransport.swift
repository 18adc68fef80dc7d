// Module RPCTransport: see docs/architecture.md
