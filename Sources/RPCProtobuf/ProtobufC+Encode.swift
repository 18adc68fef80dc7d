import CProtobufC

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// Swift → C helpers for generated `_protobufCMake` implementations. Everything they return lives
// in the arena, so nothing here needs freeing.
extension ProtobufCArena {
    /// A NUL-terminated copy of `string`. protobuf-c measures strings with `strlen`, so a string
    /// holding U+0000 is cut at that character (a protobuf-c limit; see docs/codegen.md).
    @inlinable
    public mutating func string(_ string: String) -> UnsafeMutablePointer<CChar> {
        var string = string
        return string.withUTF8 { utf8 in
            let p = allocate(CChar.self, count: utf8.count + 1)
            if utf8.count > 0 {
                UnsafeMutableRawPointer(p).copyMemory(from: utf8.baseAddress!, byteCount: utf8.count)
            }
            p[utf8.count] = 0
            return p
        }
    }

    /// A copy of `bytes` as protobuf-c's `ProtobufCBinaryData`.
    @inlinable
    public mutating func bytes(_ bytes: [UInt8]) -> ProtobufCBinaryData {
        let count = bytes.count
        if count == 0 { return ProtobufCBinaryData(len: 0, data: nil) }
        let p = allocate(UInt8.self, count: count)
        bytes.withUnsafeBufferPointer { p.initialize(from: $0.baseAddress!, count: count) }
        return ProtobufCBinaryData(len: count, data: p)
    }

    /// The C struct of a nested message.
    @inlinable
    public mutating func message<M: ProtobufCConvertible, C>(_ message: M, as type: C.Type) -> UnsafeMutablePointer<C> {
        message._protobufCMake(in: &self).assumingMemoryBound(to: C.self)
    }

    /// A copy of a repeated scalar whose Swift and C element types are the same
    /// (`Int32`/`int32_t`, `Double`/`double`, ...).
    @inlinable
    public mutating func array<T>(_ values: [T]) -> UnsafeMutablePointer<T> {
        let p = allocate(T.self, count: values.count)
        values.withUnsafeBufferPointer { p.initialize(from: $0.baseAddress!, count: values.count) }
        return p
    }

    /// A repeated field converted element by element.
    @inlinable
    public mutating func array<S, C>(_ values: [S], _ convert: (S) -> C) -> UnsafeMutablePointer<C> {
        let p = allocate(C.self, count: values.count)
        for i in 0..<values.count { (p + i).initialize(to: convert(values[i])) }
        return p
    }

    /// `repeated bool`: protobuf-c stores `protobuf_c_boolean` (an `int`).
    @inlinable
    public mutating func bools(_ values: [Bool]) -> UnsafeMutablePointer<protobuf_c_boolean> {
        array(values) { $0 ? 1 : 0 }
    }

    /// `repeated string`.
    @inlinable
    public mutating func strings(_ values: [String]) -> UnsafeMutablePointer<UnsafeMutablePointer<CChar>?> {
        let p = allocate(UnsafeMutablePointer<CChar>?.self, count: values.count)
        for i in 0..<values.count { (p + i).initialize(to: string(values[i])) }
        return p
    }

    /// `repeated bytes`.
    @inlinable
    public mutating func bytesArray(_ values: [[UInt8]]) -> UnsafeMutablePointer<ProtobufCBinaryData> {
        let p = allocate(ProtobufCBinaryData.self, count: values.count)
        for i in 0..<values.count { (p + i).initialize(to: bytes(values[i])) }
        return p
    }

    /// A repeated message field: an array of pointers to C structs.
    @inlinable
    public mutating func messages<M: ProtobufCConvertible, C>(_ values: [M], as type: C.Type) -> UnsafeMutablePointer<UnsafeMutablePointer<C>?> {
        let p = allocate(UnsafeMutablePointer<C>?.self, count: values.count)
        for i in 0..<values.count { (p + i).initialize(to: message(values[i], as: C.self)) }
        return p
    }

    /// A map field: protobuf-c's array of entry-struct pointers, in key order so the encoding is
    /// deterministic. `fill` initialises one entry struct from a key and a value.
    @inlinable
    public mutating func mapEntries<K, V, C>(
        _ map: [K: V], as type: C.Type, by areInIncreasingOrder: (K, K) -> Bool,
        _ fill: (K, V, UnsafeMutablePointer<C>, inout ProtobufCArena) -> Void
    ) -> UnsafeMutablePointer<UnsafeMutablePointer<C>?> {
        let p = allocate(UnsafeMutablePointer<C>?.self, count: map.count)
        var i = 0
        for key in map.keys.sorted(by: areInIncreasingOrder) {
            let entry = allocate(C.self)
            fill(key, map[key]!, entry, &self)
            (p + i).initialize(to: entry)
            i += 1
        }
        return p
    }
}

extension ProtobufC {
    /// A C enum value (`protoc-c` enums, oneof case enums) from a proto enum number.
    @inlinable
    public static func cEnum<E: RawRepresentable>(_ value: Int32) -> E where E.RawValue: FixedWidthInteger {
        E(rawValue: E.RawValue(truncatingIfNeeded: value))!
    }

    /// The proto enum number of a C enum value.
    @inlinable
    public static func number<E: RawRepresentable>(_ value: E) -> Int32 where E.RawValue: FixedWidthInteger {
        Int32(truncatingIfNeeded: value.rawValue)
    }

    /// Orders `bool` map keys (false first) for deterministic encoding.
    @inlinable
    public static func boolKeyOrder(_ a: Bool, _ b: Bool) -> Bool { !a && b }
}
