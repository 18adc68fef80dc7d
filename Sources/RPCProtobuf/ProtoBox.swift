/// Immutable heap storage for a message field whose type can contain the message itself
/// (`message Node { Node parent = 1; }`): a struct cannot hold itself inline. Generated code
/// replaces the box on every write, so the field keeps value semantics.
public final class ProtoBox<Value: Sendable & Equatable>: Sendable, Equatable {
    public let value: Value
    @inlinable public init(_ value: Value) { self.value = value }
    @inlinable public static func == (a: ProtoBox, b: ProtoBox) -> Bool { a === b || a.value == b.value }
}

/// A generated proto3 enum: one case per value plus `unrecognized(Int32)`, so that numbers this
/// build does not know survive a decode/encode round trip, as proto3 requires.
public protocol ProtoEnum: RawRepresentable, CaseIterable, Hashable, Sendable where RawValue == Int32 {
    /// The value with number 0 (proto3's default).
    init()
    /// The enum value's name in the `.proto` (`SERVING`), or nil for an unrecognized number.
    var protoName: String? { get }
}
