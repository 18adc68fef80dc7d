import CProtobufC

/// Measures how deeply length-delimited message fields nest in wire bytes, following the
/// protobuf-c descriptors. protobuf-c 1.4 unpacks nested messages recursively without a limit, so
/// a few hundred kilobytes of crafted input for a self-recursive type (`google.protobuf.Value`)
/// could overflow the stack; this check runs first for such types only.
@usableFromInline
enum WireDepth {
    @usableFromInline
    static func isWithinLimit(_ bytes: UnsafeRawBufferPointer, _ descriptor: UnsafePointer<ProtobufCMessageDescriptor>, limit: Int) -> Bool {
        guard let base = bytes.baseAddress else { return true }
        return scan(base.assumingMemoryBound(to: UInt8.self), bytes.count, descriptor, depth: 0, limit: limit)
    }

    /// Returns false only when nesting exceeds `limit`. Malformed input returns true: protobuf-c
    /// rejects it properly afterwards.
    private static func scan(
        _ p: UnsafePointer<UInt8>, _ count: Int, _ descriptor: UnsafePointer<ProtobufCMessageDescriptor>, depth: Int, limit: Int
    ) -> Bool {
        if depth > limit { return false }
        var i = 0
        func varint() -> UInt64? {
            var result: UInt64 = 0
            var shift: UInt64 = 0
            while i < count, shift < 64 {
                let b = p[i]
                i += 1
                result |= UInt64(b & 0x7f) << shift
                if b & 0x80 == 0 { return result }
                shift += 7
            }
            return nil
        }
        while i < count {
            guard let key = varint() else { return true }
            let fieldNumber = key >> 3
            switch key & 7 {
            case 0: guard varint() != nil else { return true }
            case 1: i += 8
            case 5: i += 4
            case 2:
                guard let length = varint(), length <= UInt64(count - i) else { return true }
                let len = Int(length)
                if fieldNumber <= UInt64(UInt32.max),
                    let field = protobuf_c_message_descriptor_get_field(descriptor, UInt32(fieldNumber)),
                    field.pointee.type == PROTOBUF_C_TYPE_MESSAGE,
                    let sub = field.pointee.descriptor
                {
                    let subDescriptor = sub.assumingMemoryBound(to: ProtobufCMessageDescriptor.self)
                    if !scan(p + i, len, subDescriptor, depth: depth + 1, limit: limit) { return false }
                }
                i += len
            default: return true
            }
        }
        return true
    }
}
