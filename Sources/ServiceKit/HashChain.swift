import Security

/// The mechanism of a tamper-evident history, shared by every service that keeps one (finance's
/// ledger, tasks' journal): entries in a sequence, each entry's hash the SHA-256 of the previous
/// entry's hash (32 zero bytes for the first) followed by the entry's canonical encoding. Changing,
/// removing, inserting or reordering any entry changes every hash after it, and verification
/// names the first entry that no longer matches.
///
/// **Personal values are hashed separately, so erasure keeps the chain verifying.** A value a
/// person may have erased (text they typed, their user id) is not in the canonical encoding: the
/// encoding holds a *commitment*, SHA-256(salt ‖ value) with 16 random bytes of salt kept next to
/// the value. Erasing deletes the value *and* its salt and keeps the commitment: the chain still
/// verifies, and without the salt the commitment cannot be tested against guesses. While a value
/// is kept, verification checks it against its commitment.
///
/// A hash chain proves the order and integrity of what it holds relative to its last hash (the
/// head); someone able to rewrite the whole store can rewrite the chain too. Noting the head
/// elsewhere (an operator's log, another service) turns that into a detectable change.
public enum HashChain {
    /// The "previous hash" of the first entry.
    public static let genesis = [UInt8](repeating: 0, count: 32)

    /// The hash of an entry whose canonical encoding is `canonical`, after `previous`.
    public static func link(previous: [UInt8], canonical: [UInt8]) -> [UInt8] { SHA256.hash(previous + canonical) }

    /// The commitment the chain holds for a personal value.
    public static func commitment(salt: [UInt8], value: [UInt8]) -> [UInt8] { SHA256.hash(salt + value) }
    public static func commitment(salt: [UInt8], value: String) -> [UInt8] { commitment(salt: salt, value: Array(value.utf8)) }

    /// Fresh salt for a commitment.
    public static func salt() -> [UInt8] { SecureRandom.bytes(16) }

    /// A personal value as stored beside the chain: its commitment (covered by the chain) and,
    /// until erased, its salt and value.
    public struct Commitment: Sendable, Equatable {
        public var name: String
        public var committed: [UInt8]
        public var salt: [UInt8]?
        public var value: [UInt8]?
        public init(name: String, committed: [UInt8], salt: [UInt8]?, value: [UInt8]?) {
            self.name = name
            self.committed = committed
            self.salt = salt
            self.value = value
        }
        public var erased: Bool { salt == nil && value == nil }
    }

    /// One stored entry as verification sees it: its position and id, the stored hashes, its
    /// canonical encoding recomputed from what is stored, and its personal values.
    public struct Link: Sendable {
        public var sequence: Int64
        public var id: String
        public var previousHash: [UInt8]
        public var entryHash: [UInt8]
        public var canonical: [UInt8]
        public var commitments: [Commitment]
        public init(sequence: Int64, id: String, previousHash: [UInt8], entryHash: [UInt8], canonical: [UInt8], commitments: [Commitment] = []) {
            self.sequence = sequence
            self.id = id
            self.previousHash = previousHash
            self.entryHash = entryHash
            self.canonical = canonical
            self.commitments = commitments
        }
    }

    /// The first entry that does not match.
    public struct Break: Sendable, Equatable {
        public var sequence: Int64
        public var id: String
        public var problem: String
        public init(sequence: Int64, id: String, problem: String) {
            self.sequence = sequence
            self.id = id
            self.problem = problem
        }
    }

    /// What verification found.
    public struct Verdict: Sendable, Equatable {
        /// Entries checked (up to and including the first broken one).
        public var checked: Int64
        public var firstBroken: Break?
        /// The last entry's hash when every entry matched (nil for an empty chain or a broken one).
        public var head: [UInt8]?
        /// Personal values erased (their commitments kept).
        public var erasedValues: Int64
        public var intact: Bool { firstBroken == nil }
        public init(checked: Int64, firstBroken: Break?, head: [UInt8]?, erasedValues: Int64 = 0) {
            self.checked = checked
            self.firstBroken = firstBroken
            self.head = head
            self.erasedValues = erasedValues
        }
    }

    public static let previousProblem = "its previous hash is not the hash of the entry before it"
    public static let contentProblem = "its content does not match its hash (changed after it was recorded)"

    /// Checks links one at a time, in sequence order (a store reads them in batches): a gap or
    /// reordering, a previous hash that is not the hash before it, content that does not give its
    /// hash, a kept personal value that does not match its commitment, a value erased without its
    /// salt (or the reverse). Stops at the first broken one.
    public struct Verifier: Sendable {
        public private(set) var checked: Int64 = 0
        public private(set) var erasedValues: Int64 = 0
        public private(set) var firstBroken: Break?
        private var previous = HashChain.genesis
        private var expected: Int64
        private var lastID = ""

        /// `first`: the sequence number of the first entry.
        public init(first: Int64 = 1) { expected = first }

        /// Checks the next link; false once the chain is broken (further links are ignored).
        @discardableResult
        public mutating func add(_ l: Link) -> Bool {
            guard firstBroken == nil else { return false }
            checked += 1
            func broken(_ problem: String) -> Bool {
                firstBroken = Break(sequence: l.sequence, id: l.id, problem: problem)
                return false
            }
            if l.sequence != expected {
                return broken("sequence \(l.sequence) where \(expected) was expected (an entry is missing or out of order)")
            }
            if l.previousHash != previous { return broken(HashChain.previousProblem) }
            let h = HashChain.link(previous: previous, canonical: l.canonical)
            if h != l.entryHash { return broken(HashChain.contentProblem) }
            for c in l.commitments {
                switch (c.value, c.salt) {
                case (let value?, let salt?):
                    if HashChain.commitment(salt: salt, value: value) != c.committed {
                        return broken("its \(c.name) does not match the committed one")
                    }
                case (nil, nil): erasedValues += 1
                default: return broken("its \(c.name) and salt are inconsistent (one erased, not the other)")
                }
            }
            previous = h
            expected += 1
            lastID = l.id
            return true
        }

        /// The verdict. `storedHead`: the head the store keeps (`.some(nil)` when it keeps heads
        /// but has none); leave it `nil` when the store keeps no head.
        public func finish(storedHead: [UInt8]?? = nil) -> Verdict {
            if let firstBroken { return Verdict(checked: checked, firstBroken: firstBroken, head: nil, erasedValues: erasedValues) }
            let head: [UInt8]? = checked == 0 ? nil : previous
            if case .some(let stored) = storedHead, stored != head {
                let problem: String
                switch (stored, head) {
                case (nil, _): problem = "entries exist but the chain has no head"
                case (_, nil): problem = "the chain has a head but no entries (entries were removed)"
                default: problem = "the chain head does not match its last entry (entries were removed after it)"
                }
                return Verdict(
                    checked: checked,
                    firstBroken: Break(sequence: stored == nil ? expected - 1 : expected, id: stored == nil ? lastID : "", problem: problem),
                    head: nil, erasedValues: erasedValues)
            }
            return Verdict(checked: checked, firstBroken: nil, head: head, erasedValues: erasedValues)
        }
    }

    /// Verifies `links` (in sequence order, the first being `first`) and, when the store keeps
    /// one, its head.
    public static func verify(_ links: some Sequence<Link>, first: Int64 = 1, storedHead: [UInt8]?? = nil) -> Verdict {
        var v = Verifier(first: first)
        for l in links { if !v.add(l) { break } }
        return v.finish(storedHead: storedHead)
    }

    /// Lower-case hex.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// The canonical encoding of a chain entry: fields written in a fixed order, each unambiguous on
/// its own — strings and byte strings as a 4-byte big-endian length then the bytes, integers as
/// 8 bytes big-endian (two's complement), counts as 4 bytes. Two different entries never encode
/// alike, and an entry encodes alike on every machine and in every version of the code (a
/// service changing its entries' shape writes a new version string first, so old entries keep
/// verifying under theirs). The encoding of finance's ledger v1, byte for byte.
public struct CanonicalEncoder: Sendable {
    public private(set) var bytes: [UInt8] = []
    public init(version: String? = nil) {
        bytes.reserveCapacity(256)
        if let version { string(version) }
    }
    public mutating func string(_ s: String) { data(Array(s.utf8)) }
    public mutating func data(_ b: [UInt8]) {
        int(Int64(b.count), width: 4)
        bytes += b
    }
    public mutating func int(_ v: Int64, width: Int = 8) {
        for i in (0..<width).reversed() { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * i))) }
    }
    public mutating func count(_ n: Int) { int(Int64(n), width: 4) }
    public mutating func bool(_ b: Bool) { bytes.append(b ? 1 : 0) }
}
