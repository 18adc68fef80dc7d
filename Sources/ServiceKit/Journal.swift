import Foundation
import Storage

/// A tamper-evident journal kept in a service's own database: entries appended in the same
/// transaction as the change they record, each linked to the one before by `HashChain`. A service
/// may keep several chains (`chain` names one: tasks keeps `team-tasks`); every chain has its own
/// sequence and head.
///
/// An entry is a `kind` (`team-task.created`), a `subject` (what it is about: a task id), the time,
/// **public fields** (names and typed values, written into the chain as they are) and **personal
/// values** (each with the user it belongs to: written into the chain only as commitments, the
/// value and its salt kept beside it until `erase(owner:)` removes them). Verification recomputes
/// every hash from what is stored, checks each kept personal value against its commitment and the
/// stored head against the last entry, and names the first broken link.
public enum Journal {
    /// Bumped if the encoding ever changes (entries keep verifying under their own version).
    public static let version = "kit-journal-v1"

    /// A public field's value.
    public enum Value: Sendable, Equatable, CustomStringConvertible {
        case text(String)
        case int(Int64)
        case bool(Bool)
        case bytes([UInt8])

        public var description: String {
            switch self {
            case .text(let s): "\"\(s)\""
            case .int(let i): String(i)
            case .bool(let b): String(b)
            case .bytes(let b): HashChain.hex(b)
            }
        }
    }

    /// A personal value: erased with its owner.
    public struct Personal: Sendable, Equatable {
        public var name: String
        /// The user whose erasure removes it.
        public var owner: String
        public var value: String
        public init(_ name: String, owner: String, _ value: String) {
            self.name = name
            self.owner = owner
            self.value = value
        }
    }

    /// What a service appends.
    public struct Record: Sendable, Equatable {
        public var kind: String
        public var subject: String
        public var fields: [(name: String, value: Value)]
        public var personal: [Personal]
        public init(kind: String, subject: String, fields: [(name: String, value: Value)] = [], personal: [Personal] = []) {
            self.kind = kind
            self.subject = subject
            self.fields = fields
            self.personal = personal
        }
        public static func == (l: Record, r: Record) -> Bool {
            l.kind == r.kind && l.subject == r.subject && l.personal == r.personal && l.fields.map(\.name) == r.fields.map(\.name)
                && l.fields.map(\.value) == r.fields.map(\.value)
        }
    }

    /// A stored entry, as read back (personal values nil once erased).
    public struct Entry: Sendable {
        public var chain: String
        public var sequence: Int64
        public var entryID: String
        public var recordedAt: Int64
        public var record: Record
        /// Personal values by position: nil where erased.
        public var personalValues: [String?]
        public var entryHash: [UInt8]
    }

    // MARK: Encoding

    /// The public fields as stored in `body` (and covered by the chain): a count, then each
    /// field's name, a type tag and its value.
    public static func encodeFields(_ fields: [(name: String, value: Value)]) -> [UInt8] {
        var e = CanonicalEncoder()
        e.count(fields.count)
        for (name, value) in fields {
            e.string(name)
            switch value {
            case .text(let s):
                e.int(1, width: 1)
                e.string(s)
            case .int(let i):
                e.int(2, width: 1)
                e.int(i)
            case .bool(let b):
                e.int(3, width: 1)
                e.bool(b)
            case .bytes(let b):
                e.int(4, width: 1)
                e.data(b)
            }
        }
        return e.bytes
    }

    /// The inverse of `encodeFields`; nil for bytes it did not write.
    public static func decodeFields(_ body: [UInt8]) -> [(name: String, value: Value)]? {
        var r = Reader(bytes: body)
        guard let n = r.int(width: 4) else { return nil }
        var out: [(String, Value)] = []
        for _ in 0..<n {
            guard let name = r.string(), let tag = r.int(width: 1) else { return nil }
            switch tag {
            case 1:
                guard let s = r.string() else { return nil }
                out.append((name, .text(s)))
            case 2:
                guard let i = r.int(width: 8) else { return nil }
                out.append((name, .int(i)))
            case 3:
                guard let b = r.int(width: 1) else { return nil }
                out.append((name, .bool(b != 0)))
            case 4:
                guard let d = r.data() else { return nil }
                out.append((name, .bytes(d)))
            default: return nil
            }
        }
        return r.atEnd ? out : nil
    }

    /// The canonical encoding of an entry: version, chain, sequence, id, kind, subject, time, the
    /// encoded public fields, then each personal value's name and commitment.
    public static func canonical(
        chain: String, sequence: Int64, entryID: String, kind: String, subject: String, recordedAt: Int64, body: [UInt8],
        commitments: [(name: String, committed: [UInt8])]
    ) -> [UInt8] {
        var e = CanonicalEncoder(version: version)
        e.string(chain)
        e.int(sequence)
        e.string(entryID)
        e.string(kind)
        e.string(subject)
        e.int(recordedAt)
        e.data(body)
        e.count(commitments.count)
        for c in commitments {
            e.string(c.name)
            e.data(c.committed)
        }
        return e.bytes
    }

    struct Reader {
        let bytes: [UInt8]
        var at = 0
        var atEnd: Bool { at == bytes.count }
        mutating func int(width: Int) -> Int64? {
            guard bytes.count - at >= width else { return nil }
            var v: Int64 = 0
            for i in 0..<width { v = v << 8 | Int64(bytes[at + i]) }
            if width < 8, width > 1, v >= 1 << (8 * width - 1) { v -= 1 << (8 * width) }
            at += width
            return v
        }
        mutating func data() -> [UInt8]? {
            guard let n = int(width: 4), n >= 0, bytes.count - at >= Int(n) else { return nil }
            defer { at += Int(n) }
            return Array(bytes[at..<at + Int(n)])
        }
        mutating func string() -> String? { data().map { String(decoding: $0, as: UTF8.self) } }
    }

    // MARK: Storage

    /// The journal's tables. List it in a service's migrations (after `Migration.kit`).
    public static let migration = Migration(
        name: "kit.journal",
        sql: """
            -- One row per entry: what the chain covers (public fields in body, personal values as
            -- commitments in journal_values) and the stored hashes.
            CREATE TABLE journal_entries (
                chain TEXT NOT NULL,
                seq INTEGER NOT NULL,               -- 1.. within the chain
                entry_id TEXT NOT NULL UNIQUE,
                kind TEXT NOT NULL,
                subject TEXT NOT NULL,
                recorded_at INTEGER NOT NULL,       -- Unix milliseconds
                body BLOB NOT NULL,                 -- Journal.encodeFields of the public fields
                prev_hash BLOB NOT NULL,
                entry_hash BLOB NOT NULL,
                PRIMARY KEY (chain, seq)
            ) WITHOUT ROWID;
            CREATE INDEX journal_entries_subject ON journal_entries(subject);
            -- Personal values: the commitment stays forever, salt and value go with their owner.
            CREATE TABLE journal_values (
                chain TEXT NOT NULL,
                seq INTEGER NOT NULL,
                position INTEGER NOT NULL,
                name TEXT NOT NULL,
                owner TEXT NOT NULL,                -- the user whose erasure removes it
                committed BLOB NOT NULL,            -- SHA-256(salt || value)
                salt BLOB,
                value TEXT,
                PRIMARY KEY (chain, seq, position)
            ) WITHOUT ROWID;
            CREATE INDEX journal_values_owner ON journal_values(owner) WHERE value IS NOT NULL;
            -- Each chain's last sequence number and hash.
            CREATE TABLE journal_heads (
                chain TEXT PRIMARY KEY NOT NULL,
                seq INTEGER NOT NULL,
                head_hash BLOB NOT NULL
            ) WITHOUT ROWID;
            """)

    /// Appends `record` to `chain` in this transaction; returns its sequence number.
    @discardableResult
    public static func append(
        _ tx: Transaction, chain: String, _ record: Record, at recordedAt: Int64, entryID: String = ULID.make()
    )
        throws -> Int64
    {
        let head = try tx.queryOne("SELECT seq, head_hash FROM journal_heads WHERE chain = ?", chain)
        let sequence = (try head?.get("seq", as: Int64.self) ?? 0) + 1
        let previous = try head?.get("head_hash", as: [UInt8].self) ?? HashChain.genesis
        let body = encodeFields(record.fields)
        var commitments: [(String, [UInt8])] = []
        var salts: [[UInt8]] = []
        for p in record.personal {
            let salt = HashChain.salt()
            salts.append(salt)
            commitments.append((p.name, HashChain.commitment(salt: salt, value: p.value)))
        }
        let hash = HashChain.link(
            previous: previous,
            canonical: canonical(
                chain: chain, sequence: sequence, entryID: entryID, kind: record.kind, subject: record.subject, recordedAt: recordedAt,
                body: body, commitments: commitments))
        try tx.execute(
            """
            INSERT INTO journal_entries (chain, seq, entry_id, kind, subject, recorded_at, body, prev_hash, entry_hash)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, chain, sequence, entryID, record.kind, record.subject, recordedAt, body, previous, hash)
        for (i, p) in record.personal.enumerated() {
            try tx.execute(
                "INSERT INTO journal_values (chain, seq, position, name, owner, committed, salt, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                chain, sequence, Int64(i), p.name, p.owner, commitments[i].1, salts[i], p.value)
        }
        try tx.execute(
            """
            INSERT INTO journal_heads (chain, seq, head_hash) VALUES (?, ?, ?)
            ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq, head_hash = excluded.head_hash
            """, chain, sequence, hash)
        return sequence
    }

    /// Erases every personal value `owner` owns (value and salt; the commitments stay, so every
    /// chain still verifies). Returns how many were erased.
    @discardableResult
    public static func erase(_ tx: Transaction, owner: String) throws -> Int {
        try tx.execute("UPDATE journal_values SET salt = NULL, value = NULL WHERE owner = ? AND value IS NOT NULL", owner)
        return tx.changes
    }

    /// The chains this database keeps.
    public static func chains(_ db: some SQLReader) throws -> [String] {
        try db.query("SELECT chain FROM journal_heads ORDER BY chain").map { try $0.get(0) }
            + db.query("SELECT DISTINCT chain FROM journal_entries WHERE chain NOT IN (SELECT chain FROM journal_heads)").map { try $0.get(0) }
    }

    /// Verifies `chain`, reading it in batches of `batch` entries.
    public static func verify(_ db: some SQLReader, chain: String, batch: Int = 2000) throws -> HashChain.Verdict {
        var verifier = HashChain.Verifier()
        var after: Int64 = Int64.min
        while true {
            let rows = try db.query(
                """
                SELECT seq, entry_id, kind, subject, recorded_at, body, prev_hash, entry_hash FROM journal_entries
                WHERE chain = ? AND seq > ? ORDER BY seq LIMIT ?
                """, chain, after, Int64(batch))
            if rows.isEmpty { break }
            let first = try rows[0].get("seq", as: Int64.self), last = try rows[rows.count - 1].get("seq", as: Int64.self)
            var values: [Int64: [HashChain.Commitment]] = [:]
            for v in try db.query(
                """
                SELECT seq, name, committed, salt, value FROM journal_values
                WHERE chain = ? AND seq BETWEEN ? AND ? ORDER BY seq, position
                """, chain, first, last)
            {
                let value: String? = try v.get("value")
                values[try v.get("seq"), default: []].append(
                    HashChain.Commitment(
                        name: try v.get("name"), committed: try v.get("committed"), salt: try v.get("salt"), value: value.map { Array($0.utf8) }))
            }
            for row in rows {
                let seq: Int64 = try row.get("seq")
                let commitments = values[seq] ?? []
                let link = HashChain.Link(
                    sequence: seq, id: try row.get("entry_id"), previousHash: try row.get("prev_hash"), entryHash: try row.get("entry_hash"),
                    canonical: canonical(
                        chain: chain, sequence: seq, entryID: try row.get("entry_id"), kind: try row.get("kind"), subject: try row.get("subject"),
                        recordedAt: try row.get("recorded_at"), body: try row.get("body"),
                        commitments: commitments.map { ($0.name, $0.committed) }),
                    commitments: commitments)
                if !verifier.add(link) { return verifier.finish() }
            }
            after = last
        }
        let head: [UInt8]? = try db.queryOne("SELECT head_hash FROM journal_heads WHERE chain = ?", chain).map { try $0.get(0) }
        return verifier.finish(storedHead: .some(head))
    }

    /// Entries of `chain` about `subject` (or all), oldest first, for an operator or a test.
    public static func entries(_ db: some SQLReader, chain: String, subject: String? = nil, limit: Int = 1000) throws -> [Entry] {
        let rows = try db.query(
            """
            SELECT seq, entry_id, kind, subject, recorded_at, body, entry_hash FROM journal_entries
            WHERE chain = ? AND (? IS NULL OR subject = ?) ORDER BY seq LIMIT ?
            """, chain, subject, subject, Int64(limit))
        return try rows.map { row in
            let seq: Int64 = try row.get("seq")
            let values = try db.query(
                "SELECT name, owner, value FROM journal_values WHERE chain = ? AND seq = ? ORDER BY position", chain, seq)
            let fields = decodeFields(try row.get("body")) ?? []
            let personal = try values.map { Personal(try $0.get("name"), owner: try $0.get("owner"), (try $0.get("value", as: String?.self)) ?? "") }
            return Entry(
                chain: chain, sequence: seq, entryID: try row.get("entry_id"), recordedAt: try row.get("recorded_at"),
                record: Record(kind: try row.get("kind"), subject: try row.get("subject"), fields: fields, personal: personal),
                personalValues: try values.map { try $0.get("value", as: String?.self) }, entryHash: try row.get("entry_hash"))
        }
    }
}
