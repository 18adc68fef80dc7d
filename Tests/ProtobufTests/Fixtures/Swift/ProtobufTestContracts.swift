// Module ProtobufTestContracts: Swift generated from Tests/ProtobufTests/Proto (test-only messages
// covering every field kind) by scripts/generate-contracts, for ProtobufTests and the leak check.
