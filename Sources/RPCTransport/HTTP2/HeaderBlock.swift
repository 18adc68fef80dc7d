import CNGHTTP2
import RPCCore

/// Builds an nghttp2 name/value array from Swift strings in one contiguous byte buffer (each
/// header is its two lengths, then its name and value bytes), so a whole header block costs one
/// allocation. nghttp2 copies the block on submit.
struct HeaderBlock {
    private var bytes: [UInt8] = []
    private(set) var count = 0
    /// A block built once and shared (a constant): never emptied for reuse.
    var isShared = false

    /// `capacity` 0 allocates nothing until the first header.
    init(capacity: Int = 512) {
        if capacity > 0 { bytes.reserveCapacity(capacity) }
    }

    /// Empties the block, keeping its storage for the next one.
    mutating func removeAll() {
        guard count > 0 else { return }
        bytes.removeAll(keepingCapacity: true)
        count = 0
    }

    /// Adds every header of `other`, in order.
    mutating func append(_ other: HeaderBlock) {
        bytes.append(contentsOf: other.bytes)
        count += other.count
    }

    @inline(__always)
    private mutating func appendLengths(_ name: Int, _ value: Int) {
        withUnsafeBytes(of: (UInt32(truncatingIfNeeded: name), UInt32(truncatingIfNeeded: value))) { bytes.append(contentsOf: $0) }
        count += 1
    }

    /// A header as nghttp2 lends it to a callback.
    mutating func add(_ name: UnsafePointer<UInt8>, _ nameLen: Int, _ value: UnsafePointer<UInt8>, _ valueLen: Int) {
        if bytes.capacity == 0 { bytes.reserveCapacity(512) }
        appendLengths(nameLen, valueLen)
        bytes.append(contentsOf: UnsafeBufferPointer(start: name, count: nameLen))
        bytes.append(contentsOf: UnsafeBufferPointer(start: value, count: valueLen))
    }

    mutating func add(_ name: String, _ value: String) {
        appendLengths(name.utf8.count, value.utf8.count)
        append(name)
        append(value)
    }

    /// Copies a string's bytes straight from its storage (no iterator, no extra retain).
    @inline(__always)
    private mutating func append(_ s: String) {
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { bytes.append(contentsOf: $0) }
        if done == nil { bytes.append(contentsOf: s.utf8) }
    }

    /// Calls `body` with each header's name and value bytes, in order.
    private func forEach(_ base: UnsafeRawPointer, _ body: (Int, UnsafeRawPointer, Int, UnsafeRawPointer, Int) -> Void) {
        Self.forEach(base, count, body)
    }

    /// Calls `body` with each of `count` headers laid out from `base` (a block's layout, which
    /// `MetadataBytes` shares): its index, name and value bytes.
    @inline(__always)
    private static func forEach(_ base: UnsafeRawPointer, _ count: Int, _ body: (Int, UnsafeRawPointer, Int, UnsafeRawPointer, Int) -> Void) {
        var offset = 0
        for i in 0..<count {
            let nameLen = Int(base.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
            let valueLen = Int(base.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self))
            let name = base + offset + 8
            body(i, name, nameLen, name + nameLen, valueLen)
            offset += 8 + nameLen + valueLen
        }
    }

    /// The headers as strings, in order.
    /// The `content-length` header's value, when present and a number (plain-HTTP requests).
    var contentLength: Int? {
        pairs.first { $0.name == "content-length" }.flatMap { Int($0.value) }
    }

    var pairs: [(name: String, value: String)] {
        var out: [(name: String, value: String)] = []
        out.reserveCapacity(count)
        bytes.withUnsafeBytes { buf in
            guard let base = buf.baseAddress else { return }
            forEach(base) { _, name, nameLen, value, valueLen in
                out.append(
                    (
                        String(decoding: UnsafeRawBufferPointer(start: name, count: nameLen), as: UTF8.self),
                        String(decoding: UnsafeRawBufferPointer(start: value, count: valueLen), as: UTF8.self)
                    ))
            }
        }
        return out
    }

    /// Adds user metadata; `-bin` values go as unpadded base64. Reserved names are skipped so a
    /// handler cannot forge `grpc-status` or pseudo-headers.
    /// Entries added with `Metadata.add(trusted:_:)` go as they are (checked in debug builds).
    mutating func add(metadata: Metadata) {
        for (i, (key, value)) in metadata.entries.enumerated() {
            if metadata.isTrusted(i), case .string(let s) = value {
                assert(!Metadata.isReserved(key) && Self.isValidName(key) && !key.hasSuffix("-bin") && Self.sanitize(s) == s, "untrustworthy \(key)")
                add(key, s)
                continue
            }
            guard !Metadata.isReserved(key) && Self.isValidName(key) else { continue }
            switch value {
            case .string(let s): add(key, Self.sanitize(s))
            case .binary(let b): add(key, Base64.encode(b))
            }
        }
    }

    /// Adds metadata a relay passes on as its client's header block carried it: the bytes as they
    /// are when they are clean (`MetadataBytes.isClean`, the usual case: one copy), else entry by
    /// entry under `add(metadata:)`'s rule (bad or reserved names dropped, text values sanitized).
    mutating func append(_ metadata: MetadataBytes) {
        guard !metadata.isEmpty else { return }
        if metadata.isClean {
            bytes.append(contentsOf: metadata.storage)
            count += metadata.count
            return
        }
        metadata.forEach { name, value in
            let key = String(decoding: name, as: UTF8.self)
            guard MetadataBytes.isGRPCName(name), !Metadata.isReserved(key) else { return true }
            if MetadataBytes.isPrintable(value) {
                appendLengths(name.count, value.count)
                bytes.append(contentsOf: name)
                bytes.append(contentsOf: value)
            } else {
                add(key, Self.sanitize(String(decoding: value, as: UTF8.self)))
            }
            return true
        }
    }

    static func isValidName(_ name: String) -> Bool {
        if let r = name.utf8.withContiguousStorageIfAvailable({ MetadataBytes.isGRPCName(UnsafeRawBufferPointer($0)) }) { return r }
        return Array(name.utf8).withUnsafeBytes { MetadataBytes.isGRPCName($0) }
    }
    /// Text metadata must be printable ASCII; anything else is replaced rather than sent broken.
    static func sanitize(_ s: String) -> String {
        @inline(__always) func printable(_ c: UInt8) -> Bool { c >= 0x20 && c <= 0x7E }
        // Over the string's own bytes when it has them (a token is a few hundred): no iterator.
        let clean = s.utf8.withContiguousStorageIfAvailable { Self.allPrintable($0) } ?? s.utf8.allSatisfy(printable)
        if clean { return s }
        return String(decoding: s.utf8.map { printable($0) ? $0 : UInt8(ascii: "?") }, as: UTF8.self)
    }

    /// Whether every byte is printable ASCII (`MetadataBytes.isPrintable`: eight at a time).
    static func allPrintable(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool { MetadataBytes.isPrintable(UnsafeRawBufferPointer(bytes)) }

    /// HPACK indexing for a header: `traceparent` (a new value on every call when tracing) is sent
    /// without indexing, so it never evicts the headers that repeat (credentials, content type,
    /// the forwarded address) from the dynamic table, which would make every request carry them
    /// as literals again. One length comparison for every other header.
    @inline(__always)
    static func indexingFlags(_ name: UnsafeRawPointer, _ nameLen: Int) -> UInt8 {
        guard nameLen == 11 else { return UInt8(NGHTTP2_NV_FLAG_NONE.rawValue) }
        var i = 0
        for c in "traceparent".utf8 {
            guard name.load(fromByteOffset: i, as: UInt8.self) == c else { return UInt8(NGHTTP2_NV_FLAG_NONE.rawValue) }
            i += 1
        }
        return UInt8(NGHTTP2_NV_FLAG_NO_INDEX.rawValue)
    }

    /// The block as nghttp2's name/value array, valid inside `body` (nghttp2 copies it on
    /// submit, so the bytes are lent read-only, and the array lives on the stack).
    func withNV<R>(_ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        bytes.withUnsafeBytes { buf in
            withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(1, count)) { nva in
                let n = Self.fill(nva, from: 0, buf, count)
                return body(nva.baseAddress!, n)
            }
        }
    }

    /// `metadata` as `withRequestNV` may lend it: itself when clean; otherwise nothing, and the
    /// entries go into this block instead (`append`: entry by entry, sanitized).
    mutating func lendable(_ metadata: MetadataBytes) -> MetadataBytes {
        if metadata.isClean { return metadata }
        append(metadata)
        return MetadataBytes()
    }

    /// A request's name/value array from its parts, each lent as it is (nothing copied: nghttp2
    /// copies the array on submit): `:path` first, then the connection's fixed headers (the
    /// other pseudo-headers among them), then this block (the call's own), then metadata a
    /// relay passes on and adds, which must be clean (`MetadataBytes.isClean`; the caller adds
    /// one that is not to this block).
    func withRequestNV<R>(
        path: String, fixed: HeaderBlock, _ forwarded: MetadataBytes, _ added: MetadataBytes,
        _ body: (UnsafePointer<nghttp2_nv>, Int) -> R
    ) -> R {
        assert(forwarded.isClean && added.isClean)
        // The path's own storage (no copy of the string: the method's path is shared by every
        // loop, and a copy would retain it).
        if let r = path.utf8.withContiguousStorageIfAvailable({ withRequestNV(path: $0, fixed: fixed, forwarded, added, body) }) {
            return r
        }
        return Array(path.utf8).withUnsafeBufferPointer { withRequestNV(path: $0, fixed: fixed, forwarded, added, body) }
    }

    private func withRequestNV<R>(
        path p: UnsafeBufferPointer<UInt8>, fixed: HeaderBlock, _ forwarded: MetadataBytes, _ added: MetadataBytes,
        _ body: (UnsafePointer<nghttp2_nv>, Int) -> R
    ) -> R {
        let total = 1 + fixed.count + count + forwarded.count + added.count
        let name: StaticString = ":path"
        return fixed.bytes.withUnsafeBytes { f in
            bytes.withUnsafeBytes { own in
                forwarded.storage.withUnsafeBytes { fw in
                    added.storage.withUnsafeBytes { ad in
                        withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: total) { nva in
                            nva.initializeElement(
                                at: 0,
                                to: nghttp2_nv(
                                    name: UnsafeMutablePointer(mutating: name.utf8Start),
                                    value: UnsafeMutablePointer(mutating: p.baseAddress ?? name.utf8Start), namelen: name.utf8CodeUnitCount,
                                    valuelen: p.count, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
                            var n = Self.fill(nva, from: 1, f, fixed.count)
                            n = Self.fill(nva, from: n, own, count)
                            n = Self.fill(nva, from: n, fw, forwarded.count)
                            n = Self.fill(nva, from: n, ad, added.count)
                            return body(nva.baseAddress!, n)
                        }
                    }
                }
            }
        }
    }

    /// Writes the entries of `count` headers laid out in `storage` into `nva` from index `start`;
    /// returns the index after them.
    @inline(__always)
    private static func fill(_ nva: UnsafeMutableBufferPointer<nghttp2_nv>, from start: Int, _ storage: UnsafeRawBufferPointer, _ count: Int) -> Int {
        guard let base = storage.baseAddress else { return start }
        forEach(base, count) { i, name, nameLen, value, valueLen in
            nva.initializeElement(
                at: start + i,
                to: nghttp2_nv(
                    name: UnsafeMutablePointer(mutating: name.assumingMemoryBound(to: UInt8.self)),
                    value: UnsafeMutablePointer(mutating: value.assumingMemoryBound(to: UInt8.self)),
                    namelen: nameLen, valuelen: valueLen, flags: indexingFlags(name, nameLen)))
        }
        return start + count
    }
}

extension String {
    /// A string from bytes nghttp2 lends to a callback.
    @inline(__always)
    init(nghttp2 ptr: UnsafePointer<UInt8>, count: Int) {
        self = String(decoding: UnsafeBufferPointer(start: ptr, count: count), as: UTF8.self)
    }
}
