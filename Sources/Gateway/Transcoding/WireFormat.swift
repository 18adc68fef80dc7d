/// The protobuf wire format at the level the JSON transcoder needs: tags, varints, fixed-width
/// numbers and length-delimited slices. The transcoder works on bytes directly (no C structs), so
/// any message the descriptors describe can be transcoded, well-known types included.
enum WireType: UInt8 {
    case varint = 0
    case fixed64 = 1
    case lengthDelimited = 2
    case startGroup = 3
    case endGroup = 4
    case fixed32 = 5
}

struct WireError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Reads one message's fields from a byte slice.
struct WireReader {
    let bytes: ArraySlice<UInt8>
    var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    var isAtEnd: Bool { index >= bytes.endIndex }

    mutating func varint() throws -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard index < bytes.endIndex else { throw WireError("truncated varint") }
            let b = bytes[index]
            index += 1
            if shift == 63 && b > 1 { throw WireError("varint overflows 64 bits") }
            result |= UInt64(b & 0x7F) << shift
            if b & 0x80 == 0 { return result }
            shift += 7
            if shift > 63 { throw WireError("varint too long") }
        }
    }

    mutating func fixed32() throws -> UInt32 {
        guard bytes.endIndex - index >= 4 else { throw WireError("truncated fixed32") }
        var v: UInt32 = 0
        for i in 0..<4 { v |= UInt32(bytes[index + i]) << (8 * UInt32(i)) }
        index += 4
        return v
    }

    mutating func fixed64() throws -> UInt64 {
        guard bytes.endIndex - index >= 8 else { throw WireError("truncated fixed64") }
        var v: UInt64 = 0
        for i in 0..<8 { v |= UInt64(bytes[index + i]) << (8 * UInt64(i)) }
        index += 8
        return v
    }

    mutating func lengthDelimited() throws -> ArraySlice<UInt8> {
        let n = try varint()
        guard n <= UInt64(bytes.endIndex - index) else { throw WireError("truncated length-delimited field") }
        let start = index
        index += Int(n)
        return bytes[start..<index]
    }

    /// The next tag, or nil at the end.
    mutating func tag() throws -> (number: Int32, type: WireType)? {
        if isAtEnd { return nil }
        let t = try varint()
        guard t >> 3 > 0, t >> 3 <= 0x1FFF_FFFF, let type = WireType(rawValue: UInt8(t & 7)) else {
            throw WireError("invalid tag \(t)")
        }
        return (Int32(t >> 3), type)
    }

    mutating func skip(_ type: WireType, number: Int32, depth: Int = 0) throws {
        switch type {
        case .varint: _ = try varint()
        case .fixed64: _ = try fixed64()
        case .fixed32: _ = try fixed32()
        case .lengthDelimited: _ = try lengthDelimited()
        case .startGroup:
            guard depth < 100 else { throw WireError("groups nested too deeply") }
            while let (n, t) = try tag() {
                if t == .endGroup {
                    guard n == number else { throw WireError("mismatched end group") }
                    return
                }
                try skip(t, number: n, depth: depth + 1)
            }
            throw WireError("unterminated group")
        case .endGroup: throw WireError("unexpected end group")
        }
    }
}

/// Appends fields to a byte buffer.
struct WireWriter {
    var bytes: [UInt8] = []

    mutating func varint(_ v: UInt64) {
        var v = v
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }
    mutating func tag(_ number: Int32, _ type: WireType) {
        varint(UInt64(UInt32(number)) << 3 | UInt64(type.rawValue))
    }
    mutating func fixed32(_ v: UInt32) {
        for i in 0..<4 { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * UInt32(i)))) }
    }
    mutating func fixed64(_ v: UInt64) {
        for i in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }
    mutating func lengthDelimited(_ number: Int32, _ payload: [UInt8]) {
        tag(number, .lengthDelimited)
        varint(UInt64(payload.count))
        bytes.append(contentsOf: payload)
    }
}

@inline(__always) func zigZag32(_ v: Int32) -> UInt64 { UInt64(UInt32(bitPattern: (v << 1) ^ (v >> 31))) }
@inline(__always) func zigZag64(_ v: Int64) -> UInt64 { UInt64(bitPattern: (v << 1) ^ (v >> 63)) }
@inline(__always) func unZigZag32(_ v: UInt64) -> Int32 {
    let u = UInt32(truncatingIfNeeded: v)
    return Int32(bitPattern: (u >> 1) ^ (0 &- (u & 1)))
}
@inline(__always) func unZigZag64(_ v: UInt64) -> Int64 { Int64(bitPattern: (v >> 1) ^ (0 &- (v & 1))) }
