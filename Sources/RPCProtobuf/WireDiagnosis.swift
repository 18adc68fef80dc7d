import CProtobufC

/// Says what is wrong with bytes that failed to decode, naming the field (by its proto name, with
/// the path through nested messages: `read_up_to.seconds`) where the wire format lets us know.
/// protobuf-c only answers yes or no, so this walks the bytes again with the same descriptors, on
/// the failure path only; the checks mirror what protobuf-c and our conversions refuse.
enum WireDiagnosis {
    /// The first problem found, or nil when the walk finds none (the caller then says only that
    /// the message could not be decoded).
    static func problem(_ bytes: UnsafeRawBufferPointer, _ descriptor: UnsafePointer<ProtobufCMessageDescriptor>) -> String? {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return nil }
        var walk = Walk(p: base.assumingMemoryBound(to: UInt8.self))
        return walk.message(0, bytes.count, descriptor, path: "", depth: 0)
    }

    private enum Kind {
        case varint, fixed64, lengthDelimited, fixed32

        init?(wireType: UInt64) {
            switch wireType {
            case 0: self = .varint
            case 1: self = .fixed64
            case 2: self = .lengthDelimited
            case 5: self = .fixed32
            default: return nil
            }
        }

        var name: String {
            switch self {
            case .varint: "a varint"
            case .fixed64: "a 64-bit value"
            case .lengthDelimited: "a length-delimited value"
            case .fixed32: "a 32-bit value"
            }
        }
    }

    private struct Walk {
        let p: UnsafePointer<UInt8>
        var i = 0

        /// A varint ending before `end`; nil when cut short or longer than 10 bytes.
        mutating func varint(_ end: Int) -> UInt64? {
            var result: UInt64 = 0
            for n in 0..<10 {
                guard i < end else { return nil }
                let b = p[i]
                i += 1
                result |= UInt64(b & 0x7f) << UInt64(7 * n)
                if b & 0x80 == 0 { return result }
            }
            return nil
        }

        mutating func message(
            _ start: Int, _ end: Int, _ descriptor: UnsafePointer<ProtobufCMessageDescriptor>, path: String, depth: Int
        ) -> String? {
            if depth > ProtobufC.recursionLimit {
                return "\(path.isEmpty ? "the message" : path) nests more than \(ProtobufC.recursionLimit) messages deep"
            }
            i = start
            while i < end {
                let at = i
                guard let key = varint(end) else { return "the field tag at byte \(at) of \(where_(path)) is cut short" }
                let number = key >> 3
                guard number > 0, number <= 536_870_911 else { return "field number \(number) at byte \(at) of \(where_(path)) is not valid" }
                let field = protobuf_c_message_descriptor_get_field(descriptor, UInt32(number))
                let name = field.map { path + String(cString: $0.pointee.name) } ?? "\(path)<field \(number)>"
                guard let kind = Kind(wireType: key & 7) else {
                    return "field \(name): wire type \(key & 7) is not supported (proto3 has no groups)"
                }
                if let field, let problem = expected(field.pointee, kind, name) { return problem }
                switch kind {
                case .varint:
                    guard varint(end) != nil else { return "field \(name): its varint is cut short or longer than 10 bytes" }
                case .fixed64, .fixed32:
                    let size = kind == .fixed64 ? 8 : 4
                    guard end - i >= size else { return "field \(name): its \(size)-byte value is cut short" }
                    i += size
                case .lengthDelimited:
                    guard let length = varint(end) else { return "field \(name): its length is cut short" }
                    guard length <= UInt64(end - i) else {
                        return "field \(name): its length (\(length) bytes) runs past the end of \(where_(path)) (\(end - i) left)"
                    }
                    let valueStart = i
                    let valueEnd = i + Int(length)
                    if let field {
                        switch field.pointee.type {
                        case PROTOBUF_C_TYPE_STRING:
                            let value = UnsafeBufferPointer(start: p + valueStart, count: valueEnd - valueStart)
                            if String(validating: value, as: UTF8.self) == nil { return "field \(name): not valid UTF-8" }
                        case PROTOBUF_C_TYPE_MESSAGE:
                            if let sub = field.pointee.descriptor {
                                let subDescriptor = sub.assumingMemoryBound(to: ProtobufCMessageDescriptor.self)
                                if let problem = message(valueStart, valueEnd, subDescriptor, path: name + ".", depth: depth + 1) {
                                    return problem
                                }
                            }
                        default: break  // bytes, or a packed repeated scalar
                        }
                    }
                    i = valueEnd
                }
            }
            return nil
        }

        /// A wire type the field's declared type cannot take.
        func expected(_ field: ProtobufCFieldDescriptor, _ kind: Kind, _ name: String) -> String? {
            let wanted: Kind
            switch field.type {
            case PROTOBUF_C_TYPE_INT32, PROTOBUF_C_TYPE_SINT32, PROTOBUF_C_TYPE_UINT32, PROTOBUF_C_TYPE_INT64,
                PROTOBUF_C_TYPE_SINT64, PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_BOOL, PROTOBUF_C_TYPE_ENUM:
                wanted = .varint
            case PROTOBUF_C_TYPE_FIXED64, PROTOBUF_C_TYPE_SFIXED64, PROTOBUF_C_TYPE_DOUBLE: wanted = .fixed64
            case PROTOBUF_C_TYPE_FIXED32, PROTOBUF_C_TYPE_SFIXED32, PROTOBUF_C_TYPE_FLOAT: wanted = .fixed32
            default: wanted = .lengthDelimited
            }
            if kind == wanted { return nil }
            // A repeated scalar may come packed.
            if kind == .lengthDelimited, field.label == PROTOBUF_C_LABEL_REPEATED { return nil }
            return "field \(name): expected \(wanted.name), got \(kind.name)"
        }

        func where_(_ path: String) -> String { path.isEmpty ? "the message" : String(path.dropLast()) }
    }
}
