// Module RPCServices: see docs/architecture.md
