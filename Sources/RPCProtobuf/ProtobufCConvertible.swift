import CProtobufC
import RPCCore

/// A generated message type whose wire format is produced and parsed by protobuf-c: the Swift
/// value is converted to the protobuf-c struct `protoc-c` generated for the same message, and
/// back. The requirements are implemented by generated code only; they traffic in raw pointers so
/// that no C type appears in the generated modules' API.
public protocol ProtobufCConvertible: ProtoMessage {
    /// The protobuf-c `ProtobufCMessageDescriptor` of the message (a `const` global in C).
    static var _protobufCDescriptor: UnsafeRawPointer { get }
    /// Whether the message type can contain itself (directly or through other messages): such
    /// input is checked for nesting depth before protobuf-c, which has no recursion limit, sees it.
    static var _protobufCRecursive: Bool { get }
    /// Builds this value's protobuf-c struct (and everything it points to) in `arena`.
    func _protobufCMake(in arena: inout ProtobufCArena) -> UnsafeMutableRawPointer
    /// Reads a value from an unpacked protobuf-c struct of this message type.
    init(_protobufC message: UnsafeRawPointer) throws
}

extension ProtobufCConvertible {
    public static var _protobufCRecursive: Bool { false }

    @inlinable
    public func serializedBytes() -> [UInt8] { ProtobufC.encode(self) }

    @inlinable
    public init(serializedBytes bytes: [UInt8]) throws { self = try ProtobufC.decode(bytes, as: Self.self) }

    /// Builds a message in one expression (swift-protobuf's idiom):
    /// `let r = Grpc_Health_V1_HealthCheckRequest.with { $0.service = "accounts.v1.Accounts" }`.
    @inlinable
    public static func with(_ populate: (inout Self) throws -> Void) rethrows -> Self {
        var message = Self()
        try populate(&message)
        return message
    }
}

/// The codec entry points and the conversion helpers generated code calls.
public enum ProtobufC {
    /// Nesting depth accepted for recursive message types, as in the C++ and Java parsers.
    public static let recursionLimit = 100

    /// Encodes a message: Swift value → protobuf-c struct (in an arena) → `protobuf_c_message_pack`.
    @inlinable
    public static func encode<M: ProtobufCConvertible>(_ message: M) -> [UInt8] {
        ProtobufCArena.with { arena in
            let c = UnsafePointer(message._protobufCMake(in: &arena).assumingMemoryBound(to: ProtobufCMessage.self))
            let size = protobuf_c_message_get_packed_size(c)
            if size == 0 { return [] }
            return [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
                count = protobuf_c_message_pack(c, buffer.baseAddress!)
            }
        }
    }

    /// Decodes a message: `protobuf_c_message_unpack` (allocating from an arena) → Swift value;
    /// the arena frees the C tree at once, so no `free_unpacked` walk is needed.
    @inlinable
    public static func decode<M: ProtobufCConvertible>(_ bytes: [UInt8], as type: M.Type) throws -> M {
        try bytes.withUnsafeBufferPointer { try decode(UnsafeRawBufferPointer($0), as: type) }
    }

    /// Decodes a message from raw bytes (a slice of a larger buffer, for instance).
    @inlinable
    public static func decode<M: ProtobufCConvertible>(_ bytes: UnsafeRawBufferPointer, as type: M.Type) throws -> M {
        let descriptor = M._protobufCDescriptor.assumingMemoryBound(to: ProtobufCMessageDescriptor.self)
        if M._protobufCRecursive, !WireDepth.isWithinLimit(bytes, descriptor, limit: recursionLimit) {
            throw failure(bytes, as: M.self)
        }
        return try ProtobufCArena.with { arena in
            try withUnsafeMutablePointer(to: &arena) { arenaPointer in
                var allocator = ProtobufCArena.allocator(arenaPointer)
                var empty: UInt8 = 0
                let message = withUnsafePointer(to: &empty) { emptyPointer in
                    protobuf_c_message_unpack(
                        descriptor, &allocator, bytes.count,
                        bytes.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? emptyPointer)
                }
                guard let message else { throw failure(bytes, as: M.self) }
                do {
                    return try M(_protobufC: UnsafeRawPointer(message))
                } catch {
                    throw failure(bytes, as: M.self)
                }
            }
        }
    }
}

extension ProtobufC {
    /// The decode error for `bytes`, naming the field at fault when the wire format tells.
    @usableFromInline
    static func failure<M: ProtobufCConvertible>(_ bytes: UnsafeRawBufferPointer, as type: M.Type) -> MessageDecodingError {
        let descriptor = M._protobufCDescriptor.assumingMemoryBound(to: ProtobufCMessageDescriptor.self)
        return MessageDecodingError(messageName: M.protoMessageName, problem: WireDiagnosis.problem(bytes, descriptor))
    }
}

/// Thrown by generated conversions for content protobuf-c accepts but proto3 forbids
/// (invalid UTF-8 in a `string` field); `ProtobufC.decode` rethrows it as `MessageDecodingError`.
public struct InvalidUTF8Error: Error, Sendable {
    public init() {}
}
