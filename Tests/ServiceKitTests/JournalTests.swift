import Foundation
import Logging
import Security
import ServiceKitTesting
import Storage
import Testing

@testable import ServiceKit

/// The kit's tamper-evident history: the canonical encoding, the chain, verification naming the
/// first bad entry, and erasure that keeps the chain verifying.
@Suite struct JournalTests {
    @Test func canonicalEncodingIsFixedAndUnambiguous() {
        var e = CanonicalEncoder(version: "v1")
        e.string("ab")
        e.int(-2)
        e.data([0xFF])
        e.count(3)
        e.bool(true)
        #expect(
            e.bytes == [0, 0, 0, 2] + Array("v1".utf8) + [0, 0, 0, 2] + Array("ab".utf8) + [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE]
                + [0, 0, 0, 1, 0xFF] + [0, 0, 0, 3] + [1])
        // Lengths keep neighbours apart: ("ab", "c") and ("a", "bc") encode differently.
        var x = CanonicalEncoder(), y = CanonicalEncoder()
        x.string("ab")
        x.string("c")
        y.string("a")
        y.string("bc")
        #expect(x.bytes != y.bytes)
        // Public fields round-trip, and anything else is refused.
        let fields: [(name: String, value: Journal.Value)] = [
            ("t", .text("héllo ✓")), ("i", .int(Int64.min)), ("b", .bool(false)), ("d", .bytes([0, 1, 2])),
        ]
        let decoded = Journal.decodeFields(Journal.encodeFields(fields))
        #expect(decoded?.map(\.name) == fields.map(\.name) && decoded?.map(\.value) == fields.map(\.value))
        #expect(Journal.decodeFields(Journal.encodeFields(fields) + [0]) == nil)
        #expect(Journal.decodeFields([0, 0, 0, 1]) == nil)
    }

    /// Finance's ledger v1 entries hash the same through the kit (its canonical encoding is the
    /// kit's): a fixed vector keeps stored chains verifying across the move.
    @Test func linkIsSHA256OfPreviousAndCanonical() {
        var e = CanonicalEncoder(version: "finance-ledger-v1")
        e.string("hh_1")
        e.int(1)
        let h = HashChain.link(previous: HashChain.genesis, canonical: e.bytes)
        #expect(h == SHA256.hash(HashChain.genesis + e.bytes))
        #expect(HashChain.commitment(salt: [1, 2], value: "x") == SHA256.hash([1, 2] + Array("x".utf8)))
    }

    func chain(_ n: Int) -> [HashChain.Link] {
        var previous = HashChain.genesis
        var out: [HashChain.Link] = []
        for i in 1...n {
            var e = CanonicalEncoder(version: "test")
            e.int(Int64(i))
            let salt = HashChain.salt()
            let committed = HashChain.commitment(salt: salt, value: "secret \(i)")
            e.data(committed)
            let h = HashChain.link(previous: previous, canonical: e.bytes)
            out.append(
                HashChain.Link(
                    sequence: Int64(i), id: "e\(i)", previousHash: previous, entryHash: h, canonical: e.bytes,
                    commitments: [.init(name: "note", committed: committed, salt: salt, value: Array("secret \(i)".utf8))]))
            previous = h
        }
        return out
    }

    @Test func verificationNamesTheFirstBrokenLink() {
        let good = chain(5)
        let ok = HashChain.verify(good, storedHead: .some(good.last!.entryHash))
        #expect(ok.intact && ok.checked == 5 && ok.head == good.last!.entryHash)

        var changed = good
        changed[2].canonical[5] ^= 1
        #expect(HashChain.verify(changed).firstBroken == .init(sequence: 3, id: "e3", problem: HashChain.contentProblem))

        var missing = good
        missing.remove(at: 1)
        #expect(HashChain.verify(missing).firstBroken?.sequence == 3)
        #expect(HashChain.verify(missing).firstBroken?.problem.contains("missing or out of order") == true)

        var swapped = good
        swapped.swapAt(1, 2)
        #expect(HashChain.verify(swapped).firstBroken?.id == "e3")

        // A rewritten entry with its hash recomputed: the next link no longer points at it.
        var rewritten = good
        rewritten[1].canonical[5] ^= 1
        rewritten[1].entryHash = HashChain.link(previous: rewritten[1].previousHash, canonical: rewritten[1].canonical)
        #expect(HashChain.verify(rewritten).firstBroken == .init(sequence: 3, id: "e3", problem: HashChain.previousProblem))

        var value = good
        value[3].commitments[0].value = Array("other".utf8)
        #expect(HashChain.verify(value).firstBroken == .init(sequence: 4, id: "e4", problem: "its note does not match the committed one"))

        var half = good
        half[0].commitments[0].value = nil
        #expect(HashChain.verify(half).firstBroken?.problem.contains("inconsistent") == true)

        // Truncated at the end: only the stored head can tell.
        let truncated = Array(good.prefix(4))
        #expect(HashChain.verify(truncated).intact)
        #expect(HashChain.verify(truncated, storedHead: .some(good.last!.entryHash)).firstBroken?.problem.contains("head") == true)
        #expect(HashChain.verify([HashChain.Link](), storedHead: .some(good.last!.entryHash)).firstBroken != nil)
        #expect(HashChain.verify(good, storedHead: .some(nil)).firstBroken?.problem.contains("no head") == true)
    }

    @Test func erasedValuesKeepTheChainVerifying() {
        var erased = chain(3)
        erased[1].commitments[0].value = nil
        erased[1].commitments[0].salt = nil
        let v = HashChain.verify(erased)
        #expect(v.intact && v.erasedValues == 1)
    }

    @Test func storedJournalAppendsVerifiesAndErases() async throws {
        let dir = TemporaryDirectory("journal")
        defer { dir.remove() }
        let db = try Database.open(directory: dir.path, fileName: "j.sqlite", migrations: [Journal.migration])
        defer { db.close() }
        try await db.write { tx in
            for i in 0..<2500 {
                let owner = i % 2 == 0 ? "alice" : "bob"
                try Journal.append(
                    tx, chain: "things",
                    Journal.Record(
                        kind: "thing.changed", subject: "t\(i % 7)", fields: [("n", .int(Int64(i)))],
                        personal: [Journal.Personal("by", owner: owner, owner), Journal.Personal("text", owner: owner, "text \(i)")]),
                    at: Int64(i))
            }
            try Journal.append(tx, chain: "other", Journal.Record(kind: "x", subject: "y"), at: 1)
        }
        var v = try await db.read { c in try Journal.verify(c, chain: "things", batch: 300) }
        #expect(v.intact && v.checked == 2500 && v.head != nil)
        #expect(try await db.read { c in try Journal.verify(c, chain: "other") }.checked == 1)
        #expect(try await db.read { c in try Journal.chains(c) } == ["other", "things"])
        let t3 = try await db.read { c in try Journal.entries(c, chain: "things", subject: "t3", limit: 2) }
        #expect(t3.map(\.sequence) == [4, 11] && t3[0].record.fields.first?.value == .int(3) && t3[0].personalValues == ["bob", "text 3"])

        // Erasing alice: her values go, the chain still verifies.
        let n = try await db.write { tx in try Journal.erase(tx, owner: "alice") }
        #expect(n == 2500)
        v = try await db.read { c in try Journal.verify(c, chain: "things") }
        #expect(v.intact && v.erasedValues == 2500)
        #expect(try await db.read { c in try Journal.entries(c, chain: "things", subject: "t0", limit: 1) }[0].personalValues == [nil, nil])

        // Someone edits entry 1234's public field: named exactly.
        try await db.write { tx in
            try tx.execute("UPDATE journal_entries SET body = ? WHERE chain = 'things' AND seq = 1234", Journal.encodeFields([("n", .int(-1))]))
        }
        v = try await db.read { c in try Journal.verify(c, chain: "things", batch: 300) }
        #expect(v.firstBroken?.sequence == 1234 && v.checked == 1234)
        // Someone deletes the middle entry instead (after restoring): named too.
        try await db.write { tx in
            try tx.execute("UPDATE journal_entries SET body = ? WHERE chain = 'things' AND seq = 1234", Journal.encodeFields([("n", .int(1233))]))
            try tx.execute("DELETE FROM journal_values WHERE chain = 'things' AND seq = 2000")
            try tx.execute("DELETE FROM journal_entries WHERE chain = 'things' AND seq = 2000")
        }
        v = try await db.read { c in try Journal.verify(c, chain: "things", batch: 300) }
        #expect(v.firstBroken?.sequence == 2001 && v.firstBroken?.problem.contains("missing") == true)
    }
}
