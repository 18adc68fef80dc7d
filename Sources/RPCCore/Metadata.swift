/// gRPC metadata: an ordered multimap of lower-case ASCII keys to values. Keys ending in `-bin`
/// carry binary values (base64 on the wire, padded or not); all other values are printable ASCII.
public struct Metadata: Sendable, Hashable, Sequence, CustomStringConvertible {
    public enum Value: Sendable, Hashable {
        case string(String)
        case binary([UInt8])
    }

    public private(set) var entries: [(key: String, value: Value)] = []
    /// Which of the first 64 entries were added with `add(trusted:_:)`: made by the caller from
    /// values known to be valid header names and values, so a transport sends them without
    /// checking them again. Not part of equality; cleared by any removal.
    public private(set) var trusted: UInt64 = 0

    public init() {}
    /// Text entries in order: `Metadata([("x-a", "1")])`.
    public init(_ elements: [(String, String)]) {
        for (k, v) in elements { add(k, v) }
    }

    public var isEmpty: Bool { entries.isEmpty }

    /// The entries whose key passes `isIncluded`, in order, with room for `extra` more (one
    /// allocation, no copy-then-remove). None of them is trusted in the result.
    public func filter(reservingExtra extra: Int = 0, _ isIncluded: (String) -> Bool) -> Metadata {
        var out = Metadata()
        out.entries.reserveCapacity(entries.count + extra)
        for e in entries where isIncluded(e.key) { out.entries.append(e) }
        return out
    }
    public var count: Int { entries.count }

    /// Adds a text value. Keys are lower-cased, as HTTP/2 requires.
    public mutating func add(_ key: String, _ value: String) {
        entries.append((key.lowercasedKey, .string(value)))
    }
    /// Adds a binary value; the key must end in `-bin`.
    public mutating func add(_ key: String, binary: [UInt8]) {
        entries.append((key.lowercasedKey, .binary(binary)))
    }
    public mutating func add(_ key: String, _ value: Value) {
        entries.append((key.lowercasedKey, value))
    }
    public mutating func append(contentsOf other: Metadata) {
        if other.trusted != 0, entries.count < 64 { trusted |= other.trusted << UInt64(entries.count) }
        entries.append(contentsOf: other.entries)
    }
    /// Adds an entry whose key is already lower-case (a name from an HTTP/2 header block, which
    /// nghttp2 has checked): no case scan. The first entry reserves room for a few more, so a
    /// request's handful of headers costs one allocation rather than one per doubling.
    public mutating func add(lowercased key: String, _ value: Value) {
        if entries.capacity == 0 { entries.reserveCapacity(4) }
        entries.append((key, value))
    }

    /// Adds a text entry the caller made and knows to be a valid header: a lower-case name of
    /// `a-z 0-9 - _ .` (not reserved, not `-bin`) and a printable ASCII value. A transport sends it
    /// without checking it again (the gateway's own headers on every relayed call); debug builds
    /// still check.
    public mutating func add(trusted key: String, _ value: String) {
        if entries.capacity == 0 { entries.reserveCapacity(4) }
        if entries.count < 64 { trusted |= 1 << UInt64(entries.count) }
        entries.append((key, .string(value)))
    }

    /// Whether `value` can be sent as a text header as it is: printable ASCII (gRPC's ASCII-Value).
    public static func isTextValue(_ value: String) -> Bool {
        value.utf8.allSatisfy { $0 >= 0x20 && $0 <= 0x7E }
    }

    /// Whether the entry at `index` was added with `add(trusted:_:)`.
    @inline(__always)
    public func isTrusted(_ index: Int) -> Bool { index < 64 && trusted & (1 << UInt64(index)) != 0 }

    /// Replaces every value of `key` with one.
    public mutating func set(_ key: String, _ value: String) {
        remove(key)
        add(key, value)
    }
    public mutating func remove(_ key: String) {
        let k = key.lowercasedKey
        trusted = 0
        entries.removeAll { $0.key == k }
    }
    public mutating func removeAll(where predicate: (String) -> Bool) {
        trusted = 0
        entries.removeAll { predicate($0.key) }
    }

    /// The first text value of `key`.
    public subscript(_ key: String) -> String? {
        let k = key.lowercasedKey
        for e in entries where e.key == k {
            if case .string(let s) = e.value { return s }
        }
        return nil
    }
    /// The first text value of `key`, a name already in lower case (a constant): no case scan of
    /// it on every lookup.
    public func first(lowercased key: String) -> String? {
        for e in entries where e.key == key {
            if case .string(let s) = e.value { return s }
        }
        return nil
    }
    /// The first binary value of `key`.
    public func binary(_ key: String) -> [UInt8]? {
        let k = key.lowercasedKey
        for e in entries where e.key == k {
            if case .binary(let b) = e.value { return b }
        }
        return nil
    }
    public func values(_ key: String) -> [Value] {
        let k = key.lowercasedKey
        return entries.filter { $0.key == k }.map(\.value)
    }

    public func makeIterator() -> IndexingIterator<[(key: String, value: Value)]> { entries.makeIterator() }

    public static func == (a: Metadata, b: Metadata) -> Bool {
        a.entries.count == b.entries.count && zip(a.entries, b.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }
    public func hash(into h: inout Hasher) {
        for e in entries { h.combine(e.key); h.combine(e.value) }
    }
    public var description: String {
        "["
            + entries.map { e in
                switch e.value {
                case .string(let s): "\(e.key): \(s)"
                case .binary(let b): "\(e.key): <\(b.count) bytes>"
                }
            }.joined(separator: ", ") + "]"
    }

    /// Header names the gRPC protocol reserves: never user metadata, never forwarded as such.
    public static func isReserved(_ key: String) -> Bool { HeaderName.classify(key).isReserved }
}

extension String {
    /// Lower-cased for a metadata key; no copy when it already is (the usual case: HTTP/2 header
    /// names arrive lower-case).
    var lowercasedKey: String {
        for c in utf8 where c >= 65 && c <= 90 { return lowercased() }
        return self
    }
}
