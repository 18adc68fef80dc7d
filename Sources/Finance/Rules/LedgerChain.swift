import Security

/// The tamper-evident ledger: each scope's entries (a household's, or the marketplace's) form a
/// hash chain. An entry's hash is SHA-256 of the previous entry's hash (32 zero bytes for the
/// first) followed by the entry's canonical encoding, so changing, removing or reordering any
/// entry changes every hash after it.
///
/// **What may be erased is hashed separately.** The description is the only text a person typed
/// (erasing its author removes it). The chain does not hold it: it holds a commitment,
/// SHA-256(salt ‖ description) with 16 random bytes of salt kept next to the text. Erasing deletes
/// the text *and* the salt, and leaves the commitment: the chain still verifies, and without the
/// salt the commitment cannot be tested against guesses of the erased text. While the text is
/// kept, verification checks it against its commitment. User ids stay (the contract keeps them,
/// shown as "Deleted user").
public enum LedgerChain {
    public static let genesis = [UInt8](repeating: 0, count: 32)
    /// Bumped if the encoding ever changes (old entries keep verifying under their version).
    static let version = "finance-ledger-v1"

    public struct Debt: Equatable, Sendable {
        public var debtor: String
        public var creditor: String
        public var cents: Int64
        public init(_ debtor: String, _ creditor: String, _ cents: Int64) {
            self.debtor = debtor
            self.creditor = creditor
            self.cents = cents
        }
    }

    /// What the chain covers of one transaction.
    public struct Entry: Equatable, Sendable {
        public var scope: String
        public var sequence: Int64
        public var transactionID: String
        public var kind: Int32
        public var currency: String
        public var totalCents: Int64
        public var splitMode: Int32
        public var createdBy: String
        public var taskID: String
        public var createdAt: Int64
        public var descriptionCommitment: [UInt8]
        public var debts: [Debt]

        public init(
            scope: String, sequence: Int64, transactionID: String, kind: Int32, currency: String, totalCents: Int64,
            splitMode: Int32, createdBy: String, taskID: String, createdAt: Int64, descriptionCommitment: [UInt8],
            debts: [Debt]
        ) {
            self.scope = scope
            self.sequence = sequence
            self.transactionID = transactionID
            self.kind = kind
            self.currency = currency
            self.totalCents = totalCents
            self.splitMode = splitMode
            self.createdBy = createdBy
            self.taskID = taskID
            self.createdAt = createdAt
            self.descriptionCommitment = descriptionCommitment
            self.debts = debts
        }
    }

    /// The canonical encoding: fixed field order; strings as a 4-byte big-endian length and their
    /// UTF-8; integers as 8 bytes big-endian (two's complement); the commitment as 32 bytes.
    public static func canonical(_ e: Entry) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256 + e.debts.count * 80)
        func str(_ s: String) {
            let b = Array(s.utf8)
            int(Int64(b.count), bytes: 4)
            out += b
        }
        func int(_ v: Int64, bytes: Int = 8) {
            for i in (0..<bytes).reversed() { out.append(UInt8(truncatingIfNeeded: v >> (8 * i))) }
        }
        str(version)
        str(e.scope)
        int(e.sequence)
        str(e.transactionID)
        int(Int64(e.kind))
        str(e.currency)
        int(e.totalCents)
        int(Int64(e.splitMode))
        str(e.createdBy)
        str(e.taskID)
        int(e.createdAt)
        int(Int64(e.descriptionCommitment.count), bytes: 4)
        out += e.descriptionCommitment
        int(Int64(e.debts.count), bytes: 4)
        for d in e.debts {
            str(d.debtor)
            str(d.creditor)
            int(d.cents)
        }
        return out
    }

    /// The entry's hash in the chain.
    public static func hash(previous: [UInt8], _ e: Entry) -> [UInt8] { SHA256.hash(previous + canonical(e)) }

    /// The commitment the chain holds for a description.
    public static func commitment(salt: [UInt8], description: String) -> [UInt8] { SHA256.hash(salt + Array(description.utf8)) }

    /// An entry as stored: what the chain covers, the stored hashes, and the text if kept.
    public struct Stored: Sendable {
        public var entry: Entry
        public var previousHash: [UInt8]
        public var entryHash: [UInt8]
        /// Nil once erased (then `salt` is nil too).
        public var description: String?
        public var salt: [UInt8]?
        public init(entry: Entry, previousHash: [UInt8], entryHash: [UInt8], description: String?, salt: [UInt8]?) {
            self.entry = entry
            self.previousHash = previousHash
            self.entryHash = entryHash
            self.description = description
            self.salt = salt
        }
    }

    public struct Verdict: Equatable, Sendable {
        public var checked: Int64
        /// The first entry that does not match: (sequence, transaction id, what).
        public var firstBad: (sequence: Int64, transactionID: String, problem: String)?
        public var head: [UInt8]?
        public var verified: Bool { firstBad == nil }
        public static func == (l: Verdict, r: Verdict) -> Bool {
            l.checked == r.checked && l.head == r.head && l.firstBad?.sequence == r.firstBad?.sequence
                && l.firstBad?.transactionID == r.firstBad?.transactionID && l.firstBad?.problem == r.firstBad?.problem
        }
    }

    /// Walks `entries` (in sequence order, as stored) and names the first that does not match.
    public static func verify(_ entries: [Stored]) -> Verdict {
        var previous = genesis
        var checked: Int64 = 0
        for (i, s) in entries.enumerated() {
            checked += 1
            let bad = { (what: String) in
                Verdict(checked: checked, firstBad: (s.entry.sequence, s.entry.transactionID, what), head: nil)
            }
            if s.entry.sequence != Int64(i + 1) {
                return bad("sequence \(s.entry.sequence) where \(i + 1) was expected (an entry is missing or out of order)")
            }
            if s.previousHash != previous { return bad("its previous hash is not the hash of the entry before it") }
            let h = hash(previous: previous, s.entry)
            if h != s.entryHash { return bad("its content does not match its hash (changed after it was recorded)") }
            switch (s.description, s.salt) {
            case (let text?, let salt?):
                if commitment(salt: salt, description: text) != s.entry.descriptionCommitment {
                    return bad("its description does not match the committed one")
                }
            case (nil, nil): break  // erased
            default: return bad("its description and salt are inconsistent (one erased, not the other)")
            }
            previous = h
        }
        return Verdict(checked: checked, firstBad: nil, head: entries.isEmpty ? nil : previous)
    }

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
