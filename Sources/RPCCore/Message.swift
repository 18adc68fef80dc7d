/// A protobuf message as our generated code exposes it: a Swift value type, encoded and decoded
/// by protobuf-c behind the scenes. Handlers and clients only ever see these values.
public protocol ProtoMessage: Sendable, Equatable {
    /// The fully qualified protobuf name (`accounts.v1.SignUpRequest`).
    static var protoMessageName: String { get }
    init()
    /// Decodes wire-format bytes; throws `RPCError(.invalidArgument)`-style errors on bad input
    /// (the transport maps a decode failure to INTERNAL/INVALID_ARGUMENT as the side requires).
    init(serializedBytes: [UInt8]) throws
    /// Encodes to wire-format bytes.
    func serializedBytes() -> [UInt8]
}

/// Raised when bytes do not decode as the expected message.
public struct MessageDecodingError: Error, Sendable, CustomStringConvertible {
    public var messageName: String
    public init(messageName: String) { self.messageName = messageName }
    public var description: String { "could not decode \(messageName)" }
}
