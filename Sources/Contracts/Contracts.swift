// Module Contracts: Swift for our own protos (Proto/), generated into Generated/ by
// scripts/generate-contracts with protoc-gen-swiftpbc (see docs/codegen.md). The well-known types
// (google.protobuf.Timestamp, ...) come from GRPCContracts, re-exported here so services need
// one import.
@_exported import GRPCContracts
