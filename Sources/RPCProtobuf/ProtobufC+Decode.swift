import CProtobufC
import RPCCore

// C → Swift helpers for generated `init(_protobufC:)` implementations. They copy out of the
// unpacked C tree, which the decode arena frees afterwards.
extension ProtobufC {
    /// A `string` field. proto3 requires valid UTF-8: anything else fails the decode.
    @inlinable
    public static func string(_ p: UnsafePointer<CChar>?) throws -> String {
        guard let p, p.pointee != 0 else { return "" }
        guard let s = String(validatingCString: p) else { throw InvalidUTF8Error() }
        return s
    }

    @inlinable
    public static func string(_ p: UnsafeMutablePointer<CChar>?) throws -> String {
        try string(UnsafePointer(p))
    }

    /// A `bytes` field.
    @inlinable
    public static func bytes(_ b: ProtobufCBinaryData) -> [UInt8] {
        guard b.len > 0, let data = b.data else { return [] }
        return [UInt8](UnsafeBufferPointer(start: data, count: b.len))
    }

    /// A repeated scalar whose Swift and C element types are the same.
    @inlinable
    public static func array<T>(_ p: UnsafeMutablePointer<T>?, _ count: Int) -> [T] {
        guard count > 0, let p else { return [] }
        return [T](UnsafeBufferPointer(start: p, count: count))
    }

    /// A repeated field converted element by element.
    @inlinable
    public static func array<C, S>(_ p: UnsafeMutablePointer<C>?, _ count: Int, _ convert: (C) throws -> S) rethrows -> [S] {
        guard count > 0, let p else { return [] }
        var out = [S]()
        out.reserveCapacity(count)
        for i in 0..<count { out.append(try convert(p[i])) }
        return out
    }

    /// `repeated bool`.
    @inlinable
    public static func bools(_ p: UnsafeMutablePointer<protobuf_c_boolean>?, _ count: Int) -> [Bool] {
        array(p, count) { $0 != 0 }
    }

    /// `repeated string`.
    @inlinable
    public static func strings(_ p: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, _ count: Int) throws -> [String] {
        try array(p, count) { try string($0) }
    }

    /// `repeated bytes`.
    @inlinable
    public static func bytesArray(_ p: UnsafeMutablePointer<ProtobufCBinaryData>?, _ count: Int) -> [[UInt8]] {
        array(p, count) { bytes($0) }
    }

    /// A nested message.
    @inlinable
    public static func message<M: ProtobufCConvertible, C>(_ p: UnsafeMutablePointer<C>, as type: M.Type) throws -> M {
        try M(_protobufC: UnsafeRawPointer(p))
    }

    /// A repeated message field.
    @inlinable
    public static func messages<M: ProtobufCConvertible, C>(
        _ p: UnsafeMutablePointer<UnsafeMutablePointer<C>?>?, _ count: Int, as type: M.Type
    ) throws -> [M] {
        try array(p, count) { entry in
            guard let entry else { return M() }
            return try M(_protobufC: UnsafeRawPointer(entry))
        }
    }

    /// A map field; a key seen twice keeps its last value, as the protobuf spec says.
    @inlinable
    public static func mapEntries<C, K: Hashable, V>(
        _ p: UnsafeMutablePointer<UnsafeMutablePointer<C>?>?, _ count: Int,
        _ read: (UnsafeMutablePointer<C>) throws -> (K, V)
    ) rethrows -> [K: V] {
        guard count > 0, let p else { return [:] }
        var out = [K: V](minimumCapacity: count)
        for i in 0..<count {
            guard let entry = p[i] else { continue }
            let (k, v) = try read(entry)
            out[k] = v
        }
        return out
    }
}
