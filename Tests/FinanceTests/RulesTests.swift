import Contracts
import RPCCore
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Finance

@Suite("Finance rules: money, splits")
struct MoneyAndSplitTests {
    @Test func currencyShape() {
        for ok in ["EUR", "USD", "CAD", "JPY"] { #expect(MoneyRules.isCurrencyCode(ok)) }
        for bad in ["", "eur", "EU", "EURO", "E1R", "ÉUR", " EU"] { #expect(!MoneyRules.isCurrencyCode(bad), "\(bad)") }
    }

    @Test func overflowIsRefused() {
        #expect(MoneyRules.add(.max, 1) == nil)
        #expect(MoneyRules.add(.min, -1) == nil)
        #expect(MoneyRules.add(5, -7) == -2)
        #expect(MoneyRules.multiply(.max / 2 + 1, 2) == nil)
        #expect(MoneyRules.sum([.max, 1, -5]) == nil)
        #expect(MoneyRules.sum([1, 2, 3]) == 6)
        #expect(MoneyRules.format(334, "EUR") == "3.34 EUR")
        #expect(MoneyRules.format(-5, "USD") == "-0.05 USD")
    }

    @Test func equalSplitGivesRemainderToTheFirstInRequestOrder() throws {
        let s = try Splits.equal(total: 1000, among: ["c", "a", "b"]).get()
        #expect(s == [.init("c", 334), .init("a", 333), .init("b", 333)])
        let t = try Splits.equal(total: 1001, among: ["x", "y", "z"]).get()
        #expect(t.map(\.cents) == [334, 334, 333])
        #expect(Splits.equal(total: 2, among: ["x", "y", "z"]) == .failure(.lessThanOneCentEach))
    }

    @Test func splitsNeverCreateOrLoseACent() throws {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<5000 {
            let n = Int.random(in: 1...20, using: &rng)
            let users = (0..<n).map { "u\($0)" }
            let total = Int64.random(in: Int64(n)...MoneyRules.maxRequestCents, using: &rng)
            let s = try Splits.equal(total: total, among: users).get()
            #expect(s.map(\.cents).reduce(0, +) == total)
            #expect(s.map(\.cents).max()! - s.map(\.cents).min()! <= 1)
            #expect(s.map(\.userID) == users)
            // Remainder cents go to a prefix.
            #expect(s.map(\.cents) == s.map(\.cents).sorted(by: >))
            let each = try Splits.each(amount: total, among: users).get()
            #expect(each.total == total * Int64(n) && each.shares.allSatisfy { $0.cents == total })
        }
    }

    @Test func customSharesMustSumExactly() {
        #expect((try? Splits.custom(total: 4500, shares: [.init("a", 2000), .init("b", 2500)]).get()) != nil)
        #expect(Splits.custom(total: 4500, shares: [.init("a", 2000), .init("b", 2499)]) == .failure(.customSumMismatch(sum: 4499)))
        #expect(Splits.custom(total: 1, shares: [.init("a", .max), .init("b", 1)]) == .failure(.customSumMismatch(sum: nil)))
    }

    @Test func formNamesEveryRejectedField() {
        var r = Finance_V1_CreateChargeRequest()
        r.splitMode = .custom
        r.amount = money(100, "eu")
        var s0 = Finance_V1_Share()
        s0.userId = "me"
        s0.amount = money(50)
        var s1 = Finance_V1_Share()
        s1.userId = "bob"
        s1.amount = money(-1)
        var s2 = Finance_V1_Share()
        s2.userId = "bob"
        s2.amount = money(10, "USD")
        r.customShares = [s0, s1, s2]
        r.housemateUserIds = ["x"]
        r.idempotencyKey = "has\ttab"
        do {
            _ = try MoneyForm(r).validate(caller: "me")
            Issue.record("accepted")
        } catch let e as RPCError {
            #expect(e.code == .invalidArgument)
            #expect(
                Set(e.failure.fields) == [
                    "household_id", "description", "amount.currency", "custom_shares[0].user_id",
                    "custom_shares[1].amount", "custom_shares[2].user_id", "housemate_user_ids",
                    "idempotency_key",
                ], "\(e.failure.fields)")
        } catch { Issue.record("\(error)") }
    }
}

@Suite("Finance rules: settle-up")
struct SettleUpTests {
    typealias G = SettleUp.Graph

    static func graph(_ edges: [(String, String, Int64)]) -> G {
        var g = G()
        for (d, c, x) in edges { g.apply(.init(d, c, x)) }
        return g
    }

    static func apply(_ g: G, _ deltas: [SettleUp.Delta]) -> G {
        var out = g
        for d in deltas { out.apply(d) }
        return out
    }

    /// Random debts among `n` users.
    static func randomGraph(_ n: Int, edges: Int, using rng: inout some RandomNumberGenerator) -> G {
        var g = G()
        for _ in 0..<edges {
            let a = Int.random(in: 0..<n, using: &rng), b = Int.random(in: 0..<n, using: &rng)
            if a != b { g.apply(.init("u\(a)", "u\(b)", Int64.random(in: 1...10_000, using: &rng))) }
        }
        return g
    }

    @Test func planClearsEverythingWithAtMostNMinusOneTransfersInAnyOrder() throws {
        var rng = SystemRandomNumberGenerator()
        for round in 0..<400 {
            let n = Int.random(in: 2...8, using: &rng)
            let g = Self.randomGraph(n, edges: Int.random(in: 0...20, using: &rng), using: &rng)
            let plan = try #require(SettleUp.plan(g))
            let people = Set(g.edges.keys.flatMap { [$0.debtor, $0.creditor] })
            #expect(plan.count <= max(0, people.count - 1), "round \(round): \(plan)")
            #expect(plan == plan.sorted { ($0.payer, $0.payee) < ($1.payer, $1.payee) })
            // Record the transfers in a random order: every one is allowed, and all balances end at 0.
            var state = g
            for t in plan.shuffled(using: &rng) {
                let deltas = try SettleUp.repay(state, t).get()
                let before = state
                state = Self.apply(state, deltas)
                // Toward zero: every pair but the payer's and payee's only shrinks (never grows,
                // never flips, none appears); theirs takes what did not travel along debts.
                let parties = Set([t.payer, t.payee])
                for (e, x) in state.edges where Set([e.debtor, e.creditor]) != parties {
                    #expect(x <= before.debt(e.debtor, e.creditor), "\(e) grew in \(t)")
                }
                // Both positions move toward zero, never past.
                let (p0, p1) = (before.positions!, state.positions!)
                #expect(p1[t.payer, default: 0] <= 0 && p1[t.payer, default: 0] == p0[t.payer, default: 0] + t.cents)
                #expect(p1[t.payee, default: 0] >= 0 && p1[t.payee, default: 0] == p0[t.payee, default: 0] - t.cents)
            }
            #expect(state.isEmpty, "round \(round): left \(state.edges) after \(plan)")
        }
    }

    @Test func planIsStableAfterOneOfItsTransfers() throws {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<400 {
            let g = Self.randomGraph(Int.random(in: 2...8, using: &rng), edges: Int.random(in: 1...20, using: &rng), using: &rng)
            let plan = try #require(SettleUp.plan(g))
            #expect(SettleUp.plan(g) == plan)  // deterministic
            guard let t = plan.randomElement(using: &rng) else { continue }
            let after = Self.apply(g, try SettleUp.repay(g, t).get())
            var rest = plan
            rest.remove(at: rest.firstIndex(of: t)!)
            #expect(try #require(SettleUp.plan(after)) == rest, "plan \(plan), recorded \(t)")
        }
    }

    @Test func aCircleTakesTwoTransfers() throws {
        let g = Self.graph([("a", "b", 500), ("b", "c", 500), ("c", "a", 500)])
        #expect(g.positions!.values.allSatisfy { $0 == 0 })
        let plan = try #require(SettleUp.plan(g))
        #expect(plan == [.init("a", "b", 500), .init("b", "a", 500)])
        let after = Self.apply(g, try SettleUp.repay(g, plan[0]).get())
        #expect(SettleUp.plan(after) == [plan[1]])
        #expect(Self.apply(after, try SettleUp.repay(after, plan[1]).get()).isEmpty)
    }

    @Test func repaymentNeverMovesABalancePastZero() throws {
        // a owes b 10.00.
        let g = Self.graph([("a", "b", 1000)])
        #expect(try SettleUp.repay(g, .init("a", "b", 400)).get() == [.init("b", "a", 400)])
        #expect(SettleUp.repay(g, .init("a", "b", 1001)) == .failure(.tooMuch(maximum: 1000)))
        #expect(SettleUp.repay(g, .init("b", "a", 1)) == .failure(.tooMuch(maximum: 0)))
        // Through a housemate: a owes b, b owes c → a may pay c (both debts shrink).
        let chain = Self.graph([("a", "b", 700), ("b", "c", 500)])
        let d = try SettleUp.repay(chain, .init("a", "c", 500)).get()
        let after = Self.apply(chain, d)
        #expect(after.debt("a", "b") == 200 && after.debt("b", "c") == 0 && after.debt("c", "a") == 0)
        #expect(SettleUp.maximumRepayment(chain, payer: "a", payee: "c") == 500)
    }

    @Test func overflowingPositionsAreReported() {
        let g = Self.graph([("a", "b", .max), ("c", "b", .max)])
        #expect(g.positions == nil)
        #expect(SettleUp.plan(g) == nil)
    }
}

@Suite("Finance rules: the hash chain")
struct LedgerChainTests {
    static func entries(_ n: Int) -> [LedgerChain.Stored] {
        var previous = LedgerChain.genesis
        return (1...n).map { i in
            let salt: [UInt8] = Array(repeating: UInt8(i), count: 16)
            let text = "entry \(i)"
            let e = LedgerChain.Entry(
                scope: "h1", sequence: Int64(i), transactionID: "t\(i)", kind: 2, currency: "EUR", totalCents: Int64(i) * 100,
                splitMode: 1, createdBy: "alice", taskID: "", createdAt: 1000 + Int64(i),
                descriptionCommitment: LedgerChain.commitment(salt: salt, description: text),
                debts: [.init("bob", "alice", Int64(i) * 100)])
            let h = LedgerChain.hash(previous: previous, e)
            defer { previous = h }
            return LedgerChain.Stored(entry: e, previousHash: previous, entryHash: h, description: text, salt: salt)
        }
    }

    @Test func anIntactChainVerifies() {
        let v = LedgerChain.verify(Self.entries(50))
        #expect(v.verified && v.checked == 50 && v.head?.count == 32)
        #expect(LedgerChain.verify([]).verified)
    }

    @Test func theFirstChangedEntryIsNamed() {
        var e = Self.entries(10)
        e[3].entry.debts[0].cents += 1  // someone edited an amount
        let v = LedgerChain.verify(e)
        #expect(v.firstBad?.sequence == 4 && v.firstBad?.transactionID == "t4", "\(v)")

        var removed = Self.entries(10)
        removed.remove(at: 6)
        #expect(LedgerChain.verify(removed).firstBad?.sequence == 8)

        var text = Self.entries(10)
        text[1].description = "entry 2 (edited)"
        #expect(LedgerChain.verify(text).firstBad?.transactionID == "t2")

        var rehashed = Self.entries(10)  // changed and re-hashed alone: the next link breaks
        rehashed[4].entry.totalCents = 1
        rehashed[4].entryHash = LedgerChain.hash(previous: rehashed[4].previousHash, rehashed[4].entry)
        #expect(LedgerChain.verify(rehashed).firstBad?.sequence == 6)
    }

    @Test func erasingADescriptionKeepsTheChainVerifying() {
        var e = Self.entries(5)
        e[2].description = nil
        e[2].salt = nil
        #expect(LedgerChain.verify(e).verified)
        e[3].salt = nil  // half-erased is not allowed
        #expect(LedgerChain.verify(e).firstBad?.sequence == 4)
    }

    @Test func canonicalEncodingIsUnambiguous() {
        var a = Self.entries(1)[0].entry
        var b = a
        a.createdBy = "ab"
        a.taskID = "c"
        b.createdBy = "a"
        b.taskID = "bc"
        #expect(LedgerChain.canonical(a) != LedgerChain.canonical(b))
        #expect(LedgerChain.hex([0, 0xAB, 0x10]) == "00ab10")
    }
}
