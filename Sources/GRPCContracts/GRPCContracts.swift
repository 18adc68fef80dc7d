// Module GRPCContracts: see docs/architecture.md
