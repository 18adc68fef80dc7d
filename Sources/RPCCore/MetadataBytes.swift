/// Request metadata as its header block carried it: each entry's name and value bytes, in order,
/// in one buffer (per entry: the name's and the value's lengths as two `UInt32`s, then the name,
/// then the value; the layout the HTTP/2 transport builds its header blocks in). What a relay
/// passes on without making a `String`, an entry or an array of any of it
/// (`RawHandler.unaryRelay`): the transport collects the bytes as nghttp2 hands them over, the
/// relay reads the one value it checks (`withFirstValue`) and adds its own entries, and the client
/// transport copies the whole buffer into the upstream's header block. The transport makes the
/// usual `Metadata` of it for everything else.
///
/// Names are lower case (HTTP/2 requires it; nghttp2 checked it); `-bin` values are base64, as on
/// the wire. `isClean` says whether every entry can go out as it is: each name of `a-z 0-9 - _ .`
/// only (gRPC's rule, stricter than HTTP's) and each text value printable ASCII (HTTP allows
/// more: tabs and bytes above 0x7E). A buffer that is not clean is sent entry by entry, with the
/// rule `Metadata` entries follow (bad names dropped, bad bytes replaced).
public struct MetadataBytes: Sendable {
    public private(set) var storage: [UInt8] = []
    public private(set) var count = 0
    public private(set) var isClean = true

    public init() {}

    public var isEmpty: Bool { count == 0 }

    /// Empties it, keeping its storage for the next request's headers.
    public mutating func removeAll() {
        guard count > 0 else {
            isClean = true
            return
        }
        storage.removeAll(keepingCapacity: true)
        count = 0
        isClean = true
    }

    /// Adds an entry as a header block carried it (a lower-case name). A name that is not metadata
    /// (`HeaderName.classify`: reserved by gRPC or HTTP) makes the buffer not clean, and is dropped
    /// when it is sent; `classified`: the caller knows it is metadata (the transport classified
    /// it already).
    public mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, classified: Bool = false) {
        // One allocation for a request's usual metadata (an access token, a few short entries)
        // and the entries a relay adds.
        if storage.capacity == 0 { storage.reserveCapacity(max(512, 8 + name.count + value.count + 128)) }
        if isClean {
            isClean = Self.isGRPCName(name) && Self.isPrintable(value) && (classified || !HeaderName.classify(name).isReserved)
        }
        appendLengths(name.count, value.count)
        storage.append(contentsOf: name)
        storage.append(contentsOf: value)
    }

    /// Adds an entry made by the caller from values known to be a valid lower-case gRPC name
    /// (not reserved, not `-bin`) and a printable ASCII value (debug builds check).
    public mutating func append(trusted name: String, _ value: String) {
        assert(
            name.utf8.withContiguousStorageIfAvailable { Self.isGRPCName(UnsafeRawBufferPointer($0)) } ?? false
                && !Metadata.isReserved(name) && !name.hasSuffix("-bin") && Metadata.isTextValue(value),
            "untrustworthy \(name)")
        if storage.capacity == 0 { storage.reserveCapacity(256) }
        appendLengths(name.utf8.count, value.utf8.count)
        append(name)
        append(value)
    }

    /// Adds an entry as a header block carried it without checking it (a transport collecting a
    /// request's metadata, whose names it classified as metadata already): `isClean` is false
    /// until `checkEntries` decides it, which the collector does before lending the bytes to
    /// anything that relies on it (most requests are never lent: their handlers get `Metadata`).
    public mutating func appendUnchecked(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        if storage.capacity == 0 { storage.reserveCapacity(max(512, 8 + name.count + value.count + 128)) }
        isClean = false
        appendLengths(name.count, value.count)
        storage.append(contentsOf: name)
        storage.append(contentsOf: value)
    }

    /// Decides `isClean` from every entry (names metadata, as `appendUnchecked` takes them).
    public mutating func checkEntries() {
        var clean = true
        forEach { name, value in
            clean = Self.isGRPCName(name) && Self.isPrintable(value)
            return clean
        }
        isClean = clean
    }

    @inline(__always)
    private mutating func append(_ s: String) {
        let done: Void? = s.utf8.withContiguousStorageIfAvailable { storage.append(contentsOf: $0) }
        if done == nil { storage.append(contentsOf: s.utf8) }
    }

    @inline(__always)
    private mutating func appendLengths(_ name: Int, _ value: Int) {
        withUnsafeBytes(of: (UInt32(truncatingIfNeeded: name), UInt32(truncatingIfNeeded: value))) { storage.append(contentsOf: $0) }
        count += 1
    }

    /// Calls `body` with each entry's name and value bytes, in order; `body` returns false to stop.
    public func forEach(_ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws -> Bool) rethrows {
        try storage.withUnsafeBytes { buf in
            guard let base = buf.baseAddress else { return }
            _ = try Self.walk(base, count, body)
        }
    }

    /// The entries from `base`; false when `body` stopped the walk.
    @inline(__always)
    private static func walk(
        _ base: UnsafeRawPointer, _ count: Int, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
    ) rethrows -> Bool {
        var offset = 0
        for _ in 0..<count {
            let nameLen = Int(base.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
            let valueLen = Int(base.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self))
            let name = UnsafeRawBufferPointer(start: base + offset + 8, count: nameLen)
            let value = UnsafeRawBufferPointer(start: base + offset + 8 + nameLen, count: valueLen)
            guard try body(name, value) else { return false }
            offset += 8 + nameLen + valueLen
        }
        return true
    }

    /// `body` with the first value of `name` (lower case), or nil when there is none.
    public func withFirstValue<R>(of name: StaticString, _ body: (UnsafeRawBufferPointer?) throws -> R) rethrows -> R {
        let wanted = UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
        return try storage.withUnsafeBytes { buf in
            var found: UnsafeRawBufferPointer?
            if let base = buf.baseAddress {
                _ = Self.walk(base, count) { n, v in
                    if Self.same(n, wanted) {
                        found = v
                        return false
                    }
                    return true
                }
            }
            return try body(found)
        }
    }

    /// Whether some entry's name passes `test` (a quick look first: most names pass no test).
    public func contains(name test: (UnsafeRawBufferPointer) -> Bool) -> Bool {
        var hit = false
        forEach { n, _ in
            hit = test(n)
            return !hit
        }
        return hit
    }

    /// The entries whose names pass `isIncluded`, in order (a copy).
    public func filter(name isIncluded: (UnsafeRawBufferPointer) -> Bool) -> MetadataBytes {
        var out = MetadataBytes()
        forEach { n, v in
            if isIncluded(n) { out.append(name: n, value: v, classified: isClean) }
            return true
        }
        return out
    }

    // MARK: The rules

    @inline(__always)
    static func same(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count where a[i] != b[i] { return false }
        return true
    }

    /// gRPC's rule for a metadata name: `a-z 0-9 - _ .`, at least one byte.
    public static func isGRPCName(_ name: UnsafeRawBufferPointer) -> Bool {
        var bad: UInt8 = 0
        for c in name {
            let ok = (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c == 45 || c == 95 || c == 46
            bad |= ok ? 0 : 1
        }
        return !name.isEmpty && bad == 0
    }

    /// Whether a name ends in `-bin` (its values are base64 of binary data).
    public static func isBinaryName(_ name: UnsafeRawBufferPointer) -> Bool {
        let n = name.count
        return n >= 4 && name[n - 4] == 45 && name[n - 3] == 98 && name[n - 2] == 105 && name[n - 1] == 110
    }

    /// Whether every byte is printable ASCII (0x20...0x7E), eight bytes at a time: a byte is out
    /// of range exactly when its top bit is set in itself (≥ 0x80), in itself minus 0x20 (below
    /// 0x20) or in itself plus 1 (0x7F). A borrow or carry crosses into the next byte only from a
    /// byte that is out of range already, so it can add no false answer. (A relayed bearer token
    /// is checked on every call: byte by byte, the compiler's loop took ≈ 1% of an authenticated
    /// relayed call.)
    public static func isPrintable(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let raw = bytes.baseAddress else { return true }
        let n = bytes.count
        var bad: UInt64 = 0
        var i = 0
        @inline(__always) func word(_ at: Int) -> UInt64 {
            let w = raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)
            return (w | (w &- 0x2020_2020_2020_2020) | (w &+ 0x0101_0101_0101_0101)) & 0x8080_8080_8080_8080
        }
        // 32 bytes a step (a token is a few hundred), the four words independent of each other.
        while i + 32 <= n {
            bad |= word(i) | word(i + 8) | word(i + 16) | word(i + 24)
            i += 32
        }
        while i + 8 <= n {
            bad |= word(i)
            i += 8
        }
        while i < n {
            let c = bytes[i]
            if c < 0x20 || c > 0x7E { return false }
            i += 1
        }
        return bad == 0
    }
}
