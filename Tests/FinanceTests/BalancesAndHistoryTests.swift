import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@Suite("Finance: balances, history, settle-up, settlements, erasure over gRPC")
struct BalancesAndHistoryTests {
    @Test func balancesListMembersFormersAndNamesInOrder() async throws {
        try await withFinance { env in
            let alice = try await env.user("alice", displayName: "Alice Martin")
            let bob = try await env.user("bob_k", displayName: "Bob Kowalski")
            let carol = try await env.user("carol.w", displayName: "Carol Wong")
            let dave = try await env.user("dave", displayName: "Dave Okafor")
            let erin = try await env.user("erin", displayName: "Erin Zed")
            let h = try await env.household([alice, carol, bob, dave, erin])
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            // No transaction yet: every housemate, zero, empty currency, ordered by display name.
            let empty = try await env.finance.getBalances(r, options: alice.options).balances
            #expect(empty.map(\.counterpart.displayName) == ["Bob Kowalski", "Carol Wong", "Dave Okafor", "Erin Zed"])
            #expect(empty.allSatisfy { $0.amount.amountCents == 0 && $0.amount.currency.isEmpty && !$0.hasLastTransactionAt && !$0.formerHousemate })
            #expect(empty.first?.counterpart.username == "bob_k")

            _ = try await env.finance.createPayment(paymentRequest(h, 10000, among: [bob, carol, dave]), options: alice.options)
            _ = try await env.finance.createCharge(chargeRequest(h, 600, among: [erin]), options: alice.options)
            // dave and erin leave; erin is settled with alice (after a repayment), dave is not.
            _ = try await env.finance.recordRepayment(repaymentRequest(h, to: alice.id, 600), options: erin.options)
            try await env.leave(h, dave)
            try await env.leave(h, erin)
            let after = try await env.finance.getBalances(r, options: alice.options).balances
            #expect(after.map(\.counterpart.displayName) == ["Bob Kowalski", "Carol Wong", "Dave Okafor"])
            #expect(after.map(\.amount.amountCents) == [-3334, -3333, -3333])
            #expect(after.map(\.formerHousemate) == [false, false, true])
            #expect(after.allSatisfy { $0.amount.currency == "EUR" && $0.hasLastTransactionAt })
            // A former member still reads; a stranger gets NOT_FOUND; so does an unknown household.
            #expect(try await env.balances(dave, h) == [alice.id: 3333, bob.id: 0, carol.id: 0])
            let stranger = try await env.user()
            await expectFailure(.notFound) { try await env.finance.getBalances(r, options: stranger.options) }
            r.householdId = "nope"
            await expectFailure(.notFound) { try await env.finance.getBalances(r, options: alice.options) }
            // Deleted household: still readable.
            try await env.deleteHousehold(h, by: alice)
            #expect(try await env.balances(bob, h)[alice.id] == 3334)
        }
    }

    @Test func namesDegradeToIdsWhileAccountsIsDown() async throws {
        try await withFinance(configure: { $0.namesCacheFor = .zero }) { env in
            let a = try await env.user(displayName: "Ann")
            let b = try await env.user(displayName: "Ben")
            let h = try await env.household([a, b])
            _ = try await env.finance.createCharge(chargeRequest(h, 250, among: [b]), options: a.options)
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            #expect(try await env.finance.getBalances(r, options: a.options).balances.map(\.counterpart.displayName) == ["Ben"])
            env.stopAccounts()  // tokens still verify (keys already known); names cannot be read
            let degraded = try await env.finance.getBalances(r, options: a.options).balances
            #expect(degraded.count == 1 && degraded[0].counterpart.userId == b.id && degraded[0].counterpart.displayName.isEmpty)
            #expect(degraded[0].amount.amountCents == 250)
        }
    }

    @Test func historyIsNewestFirstPaginatedWithTheBalanceAfterEachEntry() async throws {
        try await withFinance { env in
            let (a, b, c) = (try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            var expected: [Int64] = []
            for i in 1...45 {
                if i % 3 == 0 {
                    _ = try await env.finance.createPayment(paymentRequest(h, Int64(i * 10), among: [b]), options: a.options)
                    expected.append(-Int64(i * 10))
                } else {
                    _ = try await env.finance.createCharge(chargeRequest(h, Int64(i * 20), among: [b, c]), options: a.options)
                    expected.append(Int64(i * 10))
                }
            }
            let all = try await env.history(a, with: b.id, h, pageSize: 7)
            #expect(all.map(\.amount.amountCents) == expected.reversed())
            #expect(Set(all.map(\.transactionId)).count == 45)
            #expect(all.map(\.transactionId) == all.map(\.transactionId).sorted(by: >))
            var running: Int64 = 0
            for e in all.reversed() {
                running += e.amount.amountCents
                #expect(e.balanceAfter.amountCents == running && e.amount.amountCents != 0)
            }
            #expect(try await env.balances(a, h)[b.id] == running)
            // From b's side: the same entries, signs flipped.
            let mirrored = try await env.history(b, with: a.id, h)
            #expect(mirrored.map(\.amount.amountCents) == all.map { -$0.amount.amountCents })
            #expect(mirrored.map(\.balanceAfter.amountCents) == all.map { -$0.balanceAfter.amountCents })
            #expect(mirrored.first?.transactionTotal.currency == "EUR")

            // Default page size 20; bad input.
            var r = Finance_V1_ListTransactionsRequest()
            r.householdId = h
            r.counterpartUserId = b.id
            let first = try await env.finance.listTransactions(r, options: a.options)
            #expect(first.entries.count == 20 && !first.nextPageToken.isEmpty)
            r.pageToken = first.nextPageToken
            r.counterpartUserId = c.id  // a token of other filters
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.finance.listTransactions(r, options: a.options) }
            r.pageToken = "forged.token"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.finance.listTransactions(r, options: a.options) }
            r.pageToken = ""
            r.pageSize = -1
            r.counterpartUserId = a.id
            await expectFailure(.invalidArgument, fields: ["page_size", "counterpart_user_id"]) {
                try await env.finance.listTransactions(r, options: a.options)
            }
            r.pageSize = 0
            r.counterpartUserId = ""
            await expectFailure(.invalidArgument, fields: ["counterpart_user_id"]) { try await env.finance.listTransactions(r, options: a.options) }
            let stranger = try await env.user()
            r.counterpartUserId = a.id
            await expectFailure(.notFound) { try await env.finance.listTransactions(r, options: stranger.options) }
        }
    }

    @Test func settleUpPlanAndRepaymentsBringEveryBalanceToZero() async throws {
        try await withFinance { env in
            let users = try await (0..<5).asyncMap { _ in try await env.user() }
            let h = try await env.household(users)
            // Debts in every direction, including a circle.
            _ = try await env.finance.createCharge(chargeRequest(h, 1000, among: [users[1], users[2], users[3]]), options: users[0].options)
            _ = try await env.finance.createCharge(chargeRequest(h, 700, among: [users[2]]), options: users[1].options)
            _ = try await env.finance.createCharge(chargeRequest(h, 900, among: [users[0], users[4]]), options: users[2].options)
            _ = try await env.finance.createPayment(paymentRequest(h, 250, among: [users[1]]), options: users[4].options)
            var r = Finance_V1_GetSettleUpPlanRequest()
            r.householdId = h
            let plan = try await env.finance.getSettleUpPlan(r, options: users[3].options).transfers
            #expect(!plan.isEmpty && plan.count <= 4)
            #expect(try await env.finance.getSettleUpPlan(r, options: users[0].options).transfers == plan)  // stable
            var rest = plan
            while let t = rest.first {
                let payer = try #require(users.first { $0.id == t.payer.userId })
                let recorded = try await env.finance.recordRepayment(
                    repaymentRequest(h, to: t.payee.userId, t.amount.amountCents), options: payer.options)
                #expect(recorded.transaction.kind == .repayment && recorded.transaction.total == t.amount)
                rest.removeFirst()
                // No reshuffle: the plan is now exactly the transfers not yet made.
                #expect(try await env.finance.getSettleUpPlan(r, options: users[1].options).transfers == rest)
            }
            for u in users { #expect(try await env.balances(u, h).values.allSatisfy { $0 == 0 }, "\(u.id)") }
            #expect(try await env.verify(h).verified)
            // Nothing left to repay: past zero is refused.
            await expectFailure(.failedPrecondition, fields: ["amount"]) {
                try await env.finance.recordRepayment(repaymentRequest(h, to: users[1].id, 1), options: users[0].options)
            }
            r.householdId = ""
            await expectFailure(.invalidArgument, fields: ["household_id"]) { try await env.finance.getSettleUpPlan(r, options: users[0].options) }
        }
    }

    @Test func repaymentRules() async throws {
        try await withFinance { env in
            let (a, b, c, stranger) = (try await env.user(), try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            await expectFailure(.failedPrecondition, fields: ["amount"]) {
                try await env.finance.recordRepayment(repaymentRequest(h, to: b.id, 100), options: a.options)
            }
            _ = try await env.finance.createCharge(chargeRequest(h, 1000, among: [b]), options: a.options)  // b owes a 10.00
            let f = await expectFailure(.failedPrecondition, fields: ["amount"]) {
                try await env.finance.recordRepayment(repaymentRequest(h, to: a.id, 1001), options: b.options)
            }
            #expect(f?.message.contains("10.00 EUR") == true)
            await expectFailure(.failedPrecondition, fields: ["amount"]) {  // a owes b nothing
                try await env.finance.recordRepayment(repaymentRequest(h, to: b.id, 1), options: a.options)
            }
            await expectFailure(.invalidArgument, fields: ["amount.currency"]) {
                try await env.finance.recordRepayment(repaymentRequest(h, to: a.id, 100, currency: "USD"), options: b.options)
            }
            await expectFailure(.invalidArgument, fields: ["payee_user_id"]) {
                try await env.finance.recordRepayment(repaymentRequest(h, to: stranger.id, 100), options: b.options)
            }
            await expectFailure(.invalidArgument, fields: ["payee_user_id", "amount", "idempotency_key"]) {
                var r = repaymentRequest(h, to: b.id, 0)
                r.idempotencyKey = ""
                return try await env.finance.recordRepayment(r, options: b.options)
            }
            let key = "repay-1"
            let first = try await env.finance.recordRepayment(repaymentRequest(h, to: a.id, 400, key: key), options: b.options)
            #expect(first.transaction.description_p == "Repayment" && first.transaction.debts.count == 1)
            #expect(first.transaction.debts[0].debtorUserId == a.id && first.transaction.debts[0].amount.amountCents == 400)
            #expect(try await env.finance.recordRepayment(repaymentRequest(h, to: a.id, 400, key: key), options: b.options).replayed)
            #expect(try await env.balances(a, h)[b.id] == 600)
            // a former member can still settle up.
            try await env.leave(h, b)
            _ = try await env.finance.recordRepayment(repaymentRequest(h, to: a.id, 600), options: b.options)
            #expect(try await env.balances(b, h)[a.id] == 0)
            // The repayment reached the payee's inbox in social, and only hers.
            let repaid = first.transaction.transactionId
            #expect(try await env.moneyNotification(to: a, about: repaid) != nil)
            #expect(try await env.moneyNotifications(of: b, about: repaid).isEmpty)
            #expect(try await env.moneyNotifications(of: c, about: repaid).isEmpty)
        }
    }

    @Test func settlementsAreRecordedExactlyOncePerTask() async throws {
        try await withFinance { env in
            let (req, prov, other) = (try await env.user(), try await env.user(), try await env.user())
            var s = Finance_V1_RecordTaskSettlementRequest()
            s.idempotencyKey = "tasks:evt-1"
            s.taskId = "task-1"
            s.requesterUserId = req.id
            s.providerUserId = prov.id
            s.amount = money(2500, "CAD")
            s.description_p = "Assemble a desk"
            let first = try await env.internalAPI.recordTaskSettlement(s)
            #expect(!first.replayed && first.transaction.kind == .settlement && first.transaction.householdId.isEmpty)
            #expect(first.transaction.taskId == "task-1" && first.transaction.createdByUserId.isEmpty && first.transaction.splitMode == .unspecified)
            s.idempotencyKey = "tasks:evt-2"  // a redelivery with another event id: same task
            let again = try await env.internalAPI.recordTaskSettlement(s)
            #expect(again.replayed && again.transaction == first.transaction)
            // Concurrent deliveries of another task: one settlement.
            let s2 = {
                var c = s; c.taskId = "task-2"; return c
            }()
            let api = env.internalAPI
            let results = try await withThrowingTaskGroup(of: Bool.self) { g in
                for _ in 0..<10 { g.addTask { try await api.recordTaskSettlement(s2).replayed } }
                return try await g.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(results.filter { !$0 }.count == 1)
            var changed = s
            changed.amount = money(2600, "CAD")
            await expectFailure(.failedPrecondition, fields: ["task_id"]) { try await env.internalAPI.recordTaskSettlement(changed) }
            changed = s
            changed.providerUserId = other.id
            await expectFailure(.failedPrecondition, fields: ["task_id"]) { try await env.internalAPI.recordTaskSettlement(changed) }
            var bad = Finance_V1_RecordTaskSettlementRequest()
            bad.requesterUserId = req.id
            bad.providerUserId = req.id
            await expectFailure(.invalidArgument, fields: ["idempotency_key", "task_id", "provider_user_id", "amount", "description"]) {
                try await env.internalAPI.recordTaskSettlement(bad)
            }
            // Marketplace balances and history (empty household_id), both users notified.
            let bal = try await env.finance.getBalances(Finance_V1_GetBalancesRequest(), options: prov.options).balances
            #expect(bal.count == 1 && bal[0].amount == money(5000, "CAD") && bal[0].counterpart.userId == req.id && !bal[0].formerHousemate)
            #expect(try await env.history(req, with: prov.id, "").map(\.amount.amountCents) == [-2500, -2500])
            for user in [req, prov] {
                let n = try await env.moneyNotification(to: user, about: first.transaction.transactionId)
                #expect(n != nil && n?.hasActor == false, "\(String(describing: n))")
            }
            #expect(try await env.verify("").verified)
        }
    }

    @Test func erasedUsersKeepTheirCounterpartsEntriesAndTheChainVerifies() async throws {
        try await withFinance { env in
            let a = try await env.user(displayName: "Alice")
            let b = try await env.user(displayName: "Bob")
            let h = try await env.household([a, b])
            _ = try await env.finance.createCharge(
                chargeRequest(h, 1200, among: [a], description: "Bob's secret thing", key: "bk"), options: b.options)
            _ = try await env.finance.createCharge(chargeRequest(h, 200, among: [b], description: "Alice's line"), options: a.options)
            var erase = Finance_V1_EraseUserRequest()
            erase.eventId = "accounts:del-1"
            erase.userId = b.id
            #expect(try await !env.internalAPI.eraseUser(erase).replayed)
            #expect(try await env.internalAPI.eraseUser(erase).replayed)
            try await env.leave(h, b)
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            let bal = try await env.finance.getBalances(r, options: a.options).balances
            #expect(bal.count == 1 && bal[0].counterpart.userId == b.id && bal[0].counterpart.displayName == "Deleted user")
            #expect(bal[0].counterpart.username.isEmpty && bal[0].amount.amountCents == -1000 && bal[0].formerHousemate)
            let history = try await env.history(a, with: b.id, h)
            #expect(history.map(\.description_p) == ["Alice's line", "(erased)"])
            #expect(try await env.verify(h).verified)
            // b's idempotency keys are gone.
            let keys = try env.core.database.readSync { c in
                try c.queryOne("SELECT count(*) FROM idempotency_keys WHERE scope = ?", "finance:\(b.id)")!.get(0, as: Int64.self)
            }
            #expect(keys == 0)
            await expectFailure(.invalidArgument, fields: ["event_id", "user_id"]) {
                try await env.internalAPI.eraseUser(Finance_V1_EraseUserRequest())
            }
        }
    }

    @Test func verificationNamesTheFirstTamperedEntry() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            var ids: [String] = []
            for i in 1...6 {
                ids.append(
                    try await env.finance.createCharge(chargeRequest(h, Int64(i * 100), among: [b]), options: a.options).transaction.transactionId)
            }
            let tampered = ids[3]
            let ok = try await env.verify(h)
            #expect(ok.verified && ok.entriesChecked == 6 && ok.headHash.count == 64)
            // Someone edits an amount in the file.
            try await env.core.database.write { tx in try tx.execute("UPDATE ledger_debts SET amount_cents = 1 WHERE transaction_id = ?", tampered) }
            let bad = try await env.verify(h)
            #expect(!bad.verified && bad.firstBadTransactionId == ids[3] && bad.firstBadSequence == 4, "\(bad)")
            try await env.core.database.write { tx in try tx.execute("UPDATE ledger_debts SET amount_cents = 400 WHERE transaction_id = ?", tampered)
            }
            #expect(try await env.verify(h).verified)
            // A balance nudged without history.
            try await env.core.database.write { tx in try tx.execute("UPDATE pair_balances SET balance_cents = balance_cents + 1") }
            let off = try await env.verify(h)
            #expect(!off.verified && off.problem.contains("sum of their history"))
            #expect(try env.core.verifyAll().ok == false)
        }
    }
}
