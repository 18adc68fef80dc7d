import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@Suite("Finance: payments and charges over gRPC")
struct PaymentsAndChargesTests {
    @Test func chargeSplitEquallyAmongThreeAndBalancesFromEachSide() async throws {
        try await withFinance { env in
            let (a, b, c, d) = (try await env.user(), try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c, d])
            let charged = try await env.finance.createCharge(chargeRequest(h, 1000, among: [b, c, d]), options: a.options)
            #expect(!charged.replayed)
            let t = charged.transaction
            #expect(t.kind == .charge && t.householdId == h && t.total == money(1000) && t.splitMode == .equal && t.createdByUserId == a.id)
            #expect(t.debts.map(\.amount.amountCents) == [334, 333, 333])
            #expect(t.debts.map(\.debtorUserId) == [b.id, c.id, d.id] && t.debts.allSatisfy { $0.creditorUserId == a.id })
            #expect(try await env.balances(a, h) == [b.id: 334, c.id: 333, d.id: 333])
            #expect(try await env.balances(b, h) == [a.id: -334, c.id: 0, d.id: 0])

            // A payment: a owes b and c 5.00 each (EACH).
            let paid = try await env.finance.createPayment(paymentRequest(h, 500, among: [b, c], mode: .each), options: a.options)
            #expect(paid.transaction.kind == .payment && paid.transaction.total == money(1000))
            #expect(paid.transaction.debts.allSatisfy { $0.debtorUserId == a.id && $0.amount.amountCents == 500 })
            #expect(try await env.balances(a, h) == [b.id: -166, c.id: -167, d.id: 333])
            #expect(try await env.balances(c, h) == [a.id: 167, b.id: 0, d.id: 0])
            #expect(try await env.verify(h).verified)
        }
    }

    @Test func customSplit() async throws {
        try await withFinance { env in
            let (a, b, c) = (try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            var r = chargeRequest(h, 4500, among: [], mode: .custom)
            r.customShares = [share(b, 2000), share(c, 2500)]
            let t = try await env.finance.createCharge(r, options: a.options).transaction
            #expect(t.debts.map(\.amount.amountCents) == [2000, 2500] && t.splitMode == .custom)
            r.idempotencyKey = UUID().uuidString
            r.customShares = [share(b, 2000), share(c, 2499)]
            await expectFailure(.invalidArgument, fields: ["custom_shares"]) { try await env.finance.createCharge(r, options: a.options) }
            r.customShares = [share(b, 2000), share(c, 2500, "USD")]
            await expectFailure(.invalidArgument, fields: ["custom_shares[1].amount.currency"]) {
                try await env.finance.createCharge(r, options: a.options)
            }
            r.customShares = [share(b, 4500), share(c, 0)]
            await expectFailure(.invalidArgument, fields: ["custom_shares[1].amount"]) { try await env.finance.createCharge(r, options: a.options) }
        }
    }

    @Test func missingAndBadFieldsAreNamedTogether() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            var r = Finance_V1_CreatePaymentRequest()
            r.splitMode = .equal
            await expectFailure(.invalidArgument, fields: ["household_id", "description", "amount", "housemate_user_ids", "idempotency_key"]) {
                try await env.finance.createPayment(r, options: a.options)
            }
            var bad = paymentRequest(h, 1_000_000_001, among: [b, a, b], currency: "eur")
            bad.description_p = String(repeating: "x", count: 101)
            bad.idempotencyKey = String(repeating: "k", count: 65)
            await expectFailure(
                .invalidArgument,
                fields: [
                    "description", "amount", "amount.currency", "housemate_user_ids[1]",
                    "housemate_user_ids[2]", "idempotency_key",
                ]
            ) {
                try await env.finance.createPayment(bad, options: a.options)
            }
            var unspecified = paymentRequest(h, 100, among: [b])
            unspecified.splitMode = .unspecified
            await expectFailure(.invalidArgument, fields: ["split_mode"]) { try await env.finance.createPayment(unspecified, options: a.options) }
            await expectFailure(.invalidArgument, fields: ["amount"]) {
                try await env.finance.createPayment(paymentRequest(h, -5, among: [b]), options: a.options)
            }
            let many = try await (0..<21).asyncMap { _ in try await env.user() }
            await expectFailure(.invalidArgument, fields: ["housemate_user_ids"]) {
                try await env.finance.createPayment(paymentRequest(h, 10_000, among: many), options: a.options)
            }
            // 2 cents among 3: someone would owe nothing.
            let c = try await env.user()
            try await env.join(h, c, invitedBy: a)
            await expectFailure(.invalidArgument, fields: ["amount"]) {
                try await env.finance.createCharge(chargeRequest(h, 1, among: [b, c]), options: a.options)
            }
            // Nothing was recorded by any of these.
            #expect(try await env.balances(a, h).values.allSatisfy { $0 == 0 })
            #expect(try await env.verify(h).entriesChecked == 0)
        }
    }

    @Test func membershipIsCheckedWithSocial() async throws {
        try await withFinance { env in
            let (a, b, c, stranger, former) = (
                try await env.user(), try await env.user(), try await env.user(), try await env.user(), try await env.user()
            )
            let h = try await env.household([a, b, c], formers: [former])
            // Listed users who are not current members: each entry named.
            await expectFailure(.invalidArgument, fields: ["housemate_user_ids[1]", "housemate_user_ids[2]"]) {
                try await env.finance.createCharge(chargeRequest(h, 900, among: [b, stranger, former]), options: a.options)
            }
            var custom = chargeRequest(h, 900, among: [], mode: .custom)
            custom.customShares = [share(b, 400), share(stranger, 500)]
            await expectFailure(.invalidArgument, fields: ["custom_shares[1].user_id"]) {
                try await env.finance.createCharge(custom, options: a.options)
            }
            // The caller: never a member → NOT_FOUND; former → FAILED_PRECONDITION; unknown household → NOT_FOUND.
            await expectFailure(.notFound) { try await env.finance.createCharge(chargeRequest(h, 900, among: [b]), options: stranger.options) }
            await expectFailure(.failedPrecondition) {
                try await env.finance.createCharge(chargeRequest(h, 900, among: [b]), options: former.options)
            }
            await expectFailure(.notFound) {
                try await env.finance.createCharge(chargeRequest("no-such-household", 900, among: [b]), options: a.options)
            }
            // A deleted household keeps its history but takes no new money.
            _ = try await env.finance.createCharge(chargeRequest(h, 900, among: [b]), options: a.options)
            try await env.deleteHousehold(h, by: c)
            await expectFailure(.failedPrecondition) { try await env.finance.createCharge(chargeRequest(h, 900, among: [b]), options: a.options) }
            #expect(try await env.balances(a, h)[b.id] == 900)
        }
    }

    @Test func oneCurrencyPerHousehold() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            _ = try await env.finance.createCharge(chargeRequest(h, 100, among: [b], currency: "CAD"), options: a.options)
            let f = await expectFailure(.invalidArgument, fields: ["amount.currency"]) {
                try await env.finance.createPayment(paymentRequest(h, 100, among: [a], currency: "EUR"), options: b.options)
            }
            #expect(f?.message.contains("CAD") == true)
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            #expect(try await env.finance.getBalances(r, options: a.options).balances.map(\.amount) == [money(100, "CAD")])
        }
    }

    @Test func retriesWithOneKeyCreateOneTransactionAlsoConcurrently() async throws {
        try await withFinance { env in
            let (a, b, c) = (try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            let request = chargeRequest(h, 1000, among: [b, c], key: "retry-key-1")
            let first = try await env.finance.createCharge(request, options: a.options)
            let again = try await env.finance.createCharge(request, options: a.options)
            #expect(!first.replayed && again.replayed && again.transaction == first.transaction)
            // Same key, another request → FAILED_PRECONDITION naming the key; also across methods.
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.finance.createCharge(chargeRequest(h, 1001, among: [b, c], key: "retry-key-1"), options: a.options)
            }
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.finance.createPayment(paymentRequest(h, 1000, among: [b, c], key: "retry-key-1"), options: a.options)
            }
            // Keys are the caller's: b may use the same string.
            #expect(try await !env.finance.createCharge(chargeRequest(h, 50, among: [a], key: "retry-key-1"), options: b.options).replayed)

            // 16 concurrent copies of one new request: one transaction.
            let burst = chargeRequest(h, 777, among: [b, c], key: "concurrent-key")
            let client = env.finance
            let results = try await withThrowingTaskGroup(of: Finance_V1_CreateChargeResponse.self) { group in
                for _ in 0..<16 { group.addTask { try await client.createCharge(burst, options: a.options) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(Set(results.map(\.transaction.transactionId)).count == 1)
            #expect(results.filter { !$0.replayed }.count == 1)
            let count = try env.core.database.readSync { c in
                try c.queryOne("SELECT count(*) FROM ledger_transactions WHERE total_cents = 777")!.get(0, as: Int64.self)
            }
            #expect(count == 1)
            let balances = try await env.balances(a, h)
            #expect(balances[b.id] == 500 + 389 - 50 && balances[c.id] == 500 + 388)
        }
    }

    @Test func nothingIsRecordedWhileSocialIsDownAndRetriesWorkOnceItIsBack() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            let first = try await env.finance.createCharge(chargeRequest(h, 300, among: [b], key: "before-outage"), options: a.options)
            env.stopSocial()
            let started = ContinuousClock.now
            let f = await expectFailure(.unavailable) {
                try await env.finance.createCharge(chargeRequest(h, 400, among: [b], key: "k-down"), options: a.options)
            }
            #expect(ContinuousClock.now - started < .seconds(3))
            #expect(f?.message.contains("nothing was recorded") == true)
            #expect(f?.retryDelaySeconds != nil)
            // A retry of an acknowledged request is answered from its key, social or not.
            #expect(
                try await env.finance.createCharge(chargeRequest(h, 300, among: [b], key: "before-outage"), options: a.options).transaction
                    == first.transaction)
            await expectFailure(.unavailable) { try await env.balances(a, h) }
            env.restartSocial()
            let ok = await eventually(timeout: .seconds(10)) {
                (try? await env.finance.createCharge(chargeRequest(h, 400, among: [b], key: "k-down"), options: a.options)) != nil
            }
            #expect(ok)
            #expect(try await env.balances(a, h) == [b.id: 700])
        }
    }

    @Test func aSlowSocialIsCutOffAtTheDeadline() async throws {
        try await withFinance(slowSocial: true, configure: { $0.membershipTimeout = .milliseconds(300) }) { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            env.setSocialDelay(.seconds(2))
            let started = ContinuousClock.now
            await expectFailure(.unavailable) { try await env.finance.createCharge(chargeRequest(h, 400, among: [b]), options: a.options) }
            #expect(ContinuousClock.now - started < .milliseconds(1500))
            env.setSocialDelay(.zero)
            #expect(try await env.verify(h).entriesChecked == 0)
        }
    }

    @Test func everyHousemateIsNotifiedOnceThroughTheOutbox() async throws {
        try await withFinance { env in
            let (a, b, c) = (try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            let t = try await env.finance.createCharge(chargeRequest(h, 1000, among: [b, c], description: "Pizza night"), options: a.options)
                .transaction
            // Each housemate's inbox in social holds it once; the actor's does not.
            let n = try #require(try await env.moneyNotification(to: b, about: t.transactionId))
            #expect(try await env.moneyNotification(to: c, about: t.transactionId) != nil)
            #expect(n.kind == .moneyRecorded && n.actor.userId == a.id)
            #expect(n.title.contains("Pizza night") && n.target.transactionId == t.transactionId && n.data["household_id"] == h)
            #expect(try await env.moneyNotifications(of: a, about: t.transactionId).isEmpty)
            // The outbox row is marked delivered; a replayed request queues nothing new.
            _ = try await env.finance.createCharge(chargeRequest(h, 1000, among: [b, c], description: "Pizza night", key: "n1"), options: a.options)
            _ = try await env.finance.createCharge(chargeRequest(h, 1000, among: [b, c], description: "Pizza night", key: "n1"), options: a.options)
            #expect(await eventually { (try? await env.core.database.pendingOutbox(limit: 10).isEmpty) == true })
            let events = try env.core.database.readSync { c in try c.queryOne("SELECT count(*) FROM outbox")!.get(0, as: Int64.self) }
            #expect(events == 2)
        }
    }

    @Test func callersNeedTokensAndInternalRPCsTheServiceCredential() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            await expectFailure(.unauthenticated) { try await env.finance.createCharge(chargeRequest(h, 100, among: [b])) }
            var settle = Finance_V1_RecordTaskSettlementRequest()
            settle.taskId = "t"
            await expectFailure(.permissionDenied) {
                try await Finance_V1_FinanceInternalClient(env.server.gateway).recordTaskSettlement(settle, options: a.options)
            }
            let anonymous = try? await Finance_V1_FinanceInternalClient(env.server.anonymous).verifyLedger(Finance_V1_VerifyLedgerRequest())
            #expect(anonymous == nil)
        }
    }
}

extension Sequence {
    func asyncMap<T>(_ f: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for e in self { out.append(try await f(e)) }
        return out
    }
}
