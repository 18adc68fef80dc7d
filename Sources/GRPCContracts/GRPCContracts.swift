// Module GRPCContracts: Swift for the standard gRPC protos (health, reflection v1/v1alpha, the
// interop test service) and the protobuf well-known types (google/protobuf/{any,duration,empty,
// field_mask,struct,timestamp,wrappers}.proto), generated into Generated/ by
// scripts/generate-contracts with protoc-gen-swiftpbc. See docs/codegen.md.
//
// The well-known types live only here: Contracts imports (and re-exports) this module rather than
// generating them again, so `Google_Protobuf_Timestamp` is one type everywhere.
