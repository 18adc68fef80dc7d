import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

/// Thousands of random payments, charges, custom splits, repayments and settlements through the
/// real service; after each one: every pairwise balance equals its history and an independent
/// model, each household's balances sum to zero per currency, and no cent was created or lost by
/// splitting. Every 100 operations the same is checked through the RPCs themselves.
@Suite("Finance: property test")
struct PropertyTests {
    struct Pair: Hashable { var a: String, b: String, scope: String, currency: String }

    /// The independent model: pair → cents (positive = b owes a), from the debts the service returned.
    final class Model: @unchecked Sendable {
        var pairs: [Pair: Int64] = [:]
        func apply(_ t: Finance_V1_Transaction) {
            for d in t.debts {
                let (a, b) = d.debtorUserId < d.creditorUserId ? (d.creditorUserId, d.debtorUserId) : (d.debtorUserId, d.creditorUserId)
                let key = Pair(a: min(a, b), b: max(a, b), scope: t.householdId, currency: d.amount.currency)
                pairs[key, default: 0] += d.debtorUserId == key.b ? d.amount.amountCents : -d.amount.amountCents
            }
        }
    }

    @Test func randomOperationsKeepEveryInvariant() async throws {
        try await withFinance { env in
            var rng = SystemRandomNumberGenerator()
            let users = try await (0..<6).asyncMap { _ in try await env.user() }
            let h1 = try await env.household(Array(users[0..<5]))
            let h2 = try await env.household(Array(users[2..<6]))
            let currencyOf = [h1: "EUR", h2: "USD"]
            // The members as social answers (they do not change during the run).
            let membersOf = [h1: try await env.members(h1), h2: try await env.members(h2)]
            let model = Model()
            let operations = 2000
            var counts: [String: Int] = [:]
            for i in 0..<operations {
                let household = Bool.random(using: &rng) ? h1 : h2
                let members = users.filter { membersOf[household]!.contains($0.id) }
                let caller = members.randomElement(using: &rng)!
                let others = members.filter { $0.id != caller.id }.shuffled(using: &rng)
                let chosen = Array(others.prefix(Int.random(in: 1...others.count, using: &rng)))
                let currency = currencyOf[household]!
                let op = Int.random(in: 0..<10, using: &rng)
                var recorded: Finance_V1_Transaction?
                switch op {
                case 0...2:  // charge, equal or each
                    let mode: Finance_V1_SplitMode = Bool.random(using: &rng) ? .equal : .each
                    let cents = Int64.random(in: Int64(chosen.count)...(op == 0 ? 1_000_000_000 : 50_000), using: &rng)
                    let t = try await env.finance.createCharge(
                        chargeRequest(household, cents, among: chosen, mode: mode, currency: currency), options: caller.options
                    ).transaction
                    try Self.checkSplit(t, cents, mode: mode, users: chosen)
                    recorded = t
                    counts["charge", default: 0] += 1
                case 3...4:  // payment
                    let mode: Finance_V1_SplitMode = Bool.random(using: &rng) ? .equal : .each
                    let cents = Int64.random(in: Int64(chosen.count)...100_000, using: &rng)
                    let t = try await env.finance.createPayment(
                        paymentRequest(household, cents, among: chosen, mode: mode, currency: currency), options: caller.options
                    ).transaction
                    try Self.checkSplit(t, cents, mode: mode, users: chosen)
                    recorded = t
                    counts["payment", default: 0] += 1
                case 5...6:  // custom split
                    var r = chargeRequest(household, 0, among: [], mode: .custom, currency: currency)
                    r.customShares = chosen.map { share($0, Int64.random(in: 1...30_000, using: &rng), currency) }
                    r.amount = money(r.customShares.map(\.amount.amountCents).reduce(0, +), currency)
                    let t = try await env.finance.createCharge(r, options: caller.options).transaction
                    #expect(t.debts.map(\.amount.amountCents) == r.customShares.map(\.amount.amountCents))
                    #expect(t.debts.map(\.amount.amountCents).reduce(0, +) == t.total.amountCents)
                    recorded = t
                    counts["custom", default: 0] += 1
                case 7...8:  // repayment: a planned transfer, or a random amount (refused past zero)
                    var plan = Finance_V1_GetSettleUpPlanRequest()
                    plan.householdId = household
                    let transfers = try await env.finance.getSettleUpPlan(plan, options: caller.options).transfers
                    if let t = transfers.randomElement(using: &rng), Bool.random(using: &rng) {
                        let payer = users.first { $0.id == t.payer.userId }!
                        let part = Int64.random(in: 1...min(t.amount.amountCents, 1_000_000_000), using: &rng)
                        recorded = try await env.finance.recordRepayment(
                            repaymentRequest(household, to: t.payee.userId, part, currency: currency), options: payer.options
                        ).transaction
                        counts["repayment", default: 0] += 1
                    } else {
                        let payee = chosen[0]
                        do {
                            recorded = try await env.finance.recordRepayment(
                                repaymentRequest(household, to: payee.id, Int64.random(in: 1...20_000, using: &rng), currency: currency),
                                options: caller.options
                            ).transaction
                            counts["repayment", default: 0] += 1
                        } catch let e as RPCError where e.code == .failedPrecondition {
                            counts["refused repayment", default: 0] += 1
                        }
                    }
                default:  // marketplace settlement
                    var s = Finance_V1_RecordTaskSettlementRequest()
                    s.idempotencyKey = "tasks:\(i)"
                    s.taskId = "task-\(i)"
                    s.requesterUserId = caller.id
                    s.providerUserId = chosen[0].id
                    s.amount = money(Int64.random(in: 1...90_000, using: &rng), ["EUR", "CAD", "JPY"].randomElement(using: &rng)!)
                    s.description_p = "Task \(i)"
                    let t = try await env.internalAPI.recordTaskSettlement(s).transaction
                    #expect(t.debts.count == 1 && t.debts[0].amount == t.total)
                    recorded = t
                    counts["settlement", default: 0] += 1
                }
                if let recorded {
                    #expect(recorded.debts.allSatisfy { $0.amount.amountCents > 0 && $0.amount.currency == recorded.total.currency })
                    model.apply(recorded)
                }
                try Self.checkStore(env, model: model, after: i)
                if i % 100 == 99 { try await Self.checkThroughTheAPI(env, users: users, households: [h1, h2, ""], model: model) }
            }
            for scope in [h1, h2, ""] { #expect(try await env.verify(scope).verified) }
            print("property test: \(operations) operations \(counts.sorted { $0.key < $1.key }), \(model.pairs.count) pairs")
        }
    }

    /// EQUAL and EACH: shares in request order, no cent created or lost.
    static func checkSplit(_ t: Finance_V1_Transaction, _ cents: Int64, mode: Finance_V1_SplitMode, users: [TestUser]) throws {
        let shares = t.debts.map(\.amount.amountCents)
        #expect(shares.reduce(0, +) == t.total.amountCents)
        if mode == .equal {
            #expect(t.total.amountCents == cents)
            #expect(shares.max()! - shares.min()! <= 1 && shares == shares.sorted(by: >))
        } else {
            #expect(t.total.amountCents == cents * Int64(users.count) && shares.allSatisfy { $0 == cents })
        }
        let counterparts = t.kind == .charge ? t.debts.map(\.debtorUserId) : t.debts.map(\.creditorUserId)
        #expect(counterparts == users.map(\.id))
    }

    /// From the database: each pair's running balance = the sum of its history rows = the model;
    /// each history row's balance_after is the running sum; positions sum to zero per currency.
    static func checkStore(_ env: FinanceEnv, model: Model, after i: Int) throws {
        let (balances, sums, bad) = try env.core.database.readSync { c -> ([Pair: Int64], [Pair: Int64], Int64) in
            var balances: [Pair: Int64] = [:]
            for r in try c.query("SELECT scope, user_a, user_b, currency, balance_cents FROM pair_balances") {
                balances[Pair(a: try r.get(1), b: try r.get(2), scope: try r.get(0), currency: try r.get(3))] = try r.get(4)
            }
            var sums: [Pair: Int64] = [:]
            for r in try c.query(
                "SELECT scope, user_a, user_b, currency, sum(delta_cents) FROM pair_entries GROUP BY scope, user_a, user_b, currency")
            {
                sums[Pair(a: try r.get(1), b: try r.get(2), scope: try r.get(0), currency: try r.get(3))] = try r.get(4)
            }
            // Rows whose balance_after is not the running sum of their pair up to them.
            let bad = try c.queryOne(
                """
                SELECT count(*) FROM (SELECT balance_after_cents, sum(delta_cents) OVER (PARTITION BY scope, user_a, user_b, currency
                    ORDER BY transaction_id) AS running FROM pair_entries) WHERE running != balance_after_cents
                """)!.get(0, as: Int64.self)
            return (balances, sums, bad)
        }
        #expect(bad == 0, "after operation \(i)")
        #expect(balances == sums, "after operation \(i)")
        let nonZeroModel = model.pairs.filter { $0.value != 0 }
        #expect(balances.filter { $0.value != 0 } == nonZeroModel, "after operation \(i)")
        // Positions of each scope and currency sum to zero.
        var positions: [String: [String: Int64]] = [:]
        for (p, cents) in balances {
            positions["\(p.scope)/\(p.currency)", default: [:]][p.a, default: 0] += cents
            positions["\(p.scope)/\(p.currency)", default: [:]][p.b, default: 0] -= cents
        }
        for (scope, ps) in positions { #expect(ps.values.reduce(0, +) == 0, "\(scope) after operation \(i)") }
    }

    /// Through the RPCs: every user's balances equal the sum of their paginated history with
    /// each counterpart (and the model).
    static func checkThroughTheAPI(_ env: FinanceEnv, users: [TestUser], households: [String], model: Model) async throws {
        for scope in households {
            for u in users {
                var r = Finance_V1_GetBalancesRequest()
                r.householdId = scope
                let balances: [Finance_V1_Balance]
                do { balances = try await env.finance.getBalances(r, options: u.options).balances } catch let e as RPCError where e.code == .notFound
                {
                    continue  // not a member of this household
                }
                var sumsByCounterpart: [String: [String: Int64]] = [:]
                for b in balances where b.amount.amountCents != 0 || b.hasLastTransactionAt {
                    if sumsByCounterpart[b.counterpart.userId] == nil {
                        var sums: [String: Int64] = [:]
                        for e in try await env.history(u, with: b.counterpart.userId, scope, pageSize: 100) {
                            sums[e.amount.currency, default: 0] += e.amount.amountCents
                        }
                        sumsByCounterpart[b.counterpart.userId] = sums
                    }
                    #expect(sumsByCounterpart[b.counterpart.userId]?[b.amount.currency] ?? 0 == b.amount.amountCents)
                    let key = Pair(a: min(u.id, b.counterpart.userId), b: max(u.id, b.counterpart.userId), scope: scope, currency: b.amount.currency)
                    let fromModel = model.pairs[key] ?? 0
                    #expect(b.amount.amountCents == (u.id == key.a ? fromModel : -fromModel))
                }
            }
        }
    }
}
