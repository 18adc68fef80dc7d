import CNGHTTP2
import RPCCore

/// Builds an nghttp2 name/value array from Swift strings with one contiguous byte buffer, so a
/// whole header block costs two allocations. nghttp2 copies the block on submit.
struct HeaderBlock {
    private var bytes: [UInt8] = []
    private var spans: [(Int, Int, Int, Int)] = []

    /// `capacity` 0 allocates nothing until the first header.
    init(capacity: Int = 256) {
        guard capacity > 0 else { return }
        bytes.reserveCapacity(capacity)
        spans.reserveCapacity(8)
    }

    var isEmpty: Bool { spans.isEmpty }

    /// Adds every header of `other`, in order.
    mutating func append(_ other: HeaderBlock) {
        let base = bytes.count
        bytes.append(contentsOf: other.bytes)
        for s in other.spans { spans.append((s.0 + base, s.1, s.2 + base, s.3)) }
    }

    /// A header as nghttp2 lends it to a callback.
    mutating func add(_ name: UnsafePointer<UInt8>, _ nameLen: Int, _ value: UnsafePointer<UInt8>, _ valueLen: Int) {
        let n0 = bytes.count
        bytes.append(contentsOf: UnsafeBufferPointer(start: name, count: nameLen))
        let v0 = bytes.count
        bytes.append(contentsOf: UnsafeBufferPointer(start: value, count: valueLen))
        spans.append((n0, nameLen, v0, valueLen))
    }

    /// The headers as strings, in order.
    var pairs: [(name: String, value: String)] {
        spans.map { s in
            (String(decoding: bytes[s.0..<s.0 + s.1], as: UTF8.self), String(decoding: bytes[s.2..<s.2 + s.3], as: UTF8.self))
        }
    }

    mutating func add(_ name: String, _ value: String) {
        let n0 = bytes.count
        append(name)
        let v0 = bytes.count
        append(value)
        spans.append((n0, v0 - n0, v0, bytes.count - v0))
    }

    /// Copies a string's bytes straight from its storage (no iterator, no extra retain).
    @inline(__always)
    private mutating func append(_ s: String) {
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { bytes.append(contentsOf: $0) }
        if done == nil { bytes.append(contentsOf: s.utf8) }
    }

    /// Adds user metadata; `-bin` values go as unpadded base64. Reserved names are skipped so a
    /// handler cannot forge `grpc-status` or pseudo-headers.
    mutating func add(metadata: Metadata) {
        for (key, value) in metadata where !Metadata.isReserved(key) && Self.isValidName(key) {
            switch value {
            case .string(let s): add(key, Self.sanitize(s))
            case .binary(let b): add(key, Base64.encode(b))
            }
        }
    }

    static func isValidName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.allSatisfy { c in
            (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c == 45 || c == 95 || c == 46
        }
    }
    /// Text metadata must be printable ASCII; anything else is replaced rather than sent broken.
    static func sanitize(_ s: String) -> String {
        if s.utf8.allSatisfy({ $0 >= 0x20 && $0 <= 0x7E }) { return s }
        return String(decoding: s.utf8.map { $0 >= 0x20 && $0 <= 0x7E ? $0 : UInt8(ascii: "?") }, as: UTF8.self)
    }

    /// The block as nghttp2's name/value array, valid inside `body` (nghttp2 copies it on
    /// submit, so the bytes are lent read-only, and the array lives on the stack).
    func withNV<R>(_ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        bytes.withUnsafeBufferPointer { buf in
            let base = UnsafeMutablePointer(mutating: buf.baseAddress ?? UnsafePointer(bitPattern: 1)!)
            return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(1, spans.count)) { nva in
                for (i, s) in spans.enumerated() {
                    nva.initializeElement(at: i, to: nghttp2_nv(name: base + s.0, value: base + s.2, namelen: s.1, valuelen: s.3,
                                                                flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
                }
                return body(nva.baseAddress!, spans.count)
            }
        }
    }
}

extension String {
    /// A string from bytes nghttp2 lends to a callback.
    @inline(__always)
    init(nghttp2 ptr: UnsafePointer<UInt8>, count: Int) {
        self = String(decoding: UnsafeBufferPointer(start: ptr, count: count), as: UTF8.self)
    }
}
