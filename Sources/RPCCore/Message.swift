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

/// Raised when bytes do not decode as the expected message; `problem` names the field and what
/// was wrong with it where the decoder could tell.
public struct MessageDecodingError: Error, Sendable, CustomStringConvertible {
    public var messageName: String
    public var problem: String?
    public init(messageName: String, problem: String? = nil) {
        self.messageName = messageName
        self.problem = problem
    }
    public var description: String { "could not decode \(messageName)" + (problem.map { ": \($0)" } ?? "") }

    /// What a peer is told of `error`, thrown while decoding a `messageName`.
    public static func describe(_ error: any Error, messageName: String) -> String {
        (error as? MessageDecodingError)?.description ?? "could not decode \(messageName)"
    }
}
