import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

/// What a hostile or careless client tries: huge or malformed input, many writers on the same
/// pairs at once, bytes that are not a message.
@Suite("Finance: hostile clients")
struct HostileClientTests {
    @Test func hugeAndMalformedInputIsRefusedClearly() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            // Larger than the method's request budget (64 KiB): refused by the transport, unread.
            var huge = chargeRequest(h, 100, among: [b])
            huge.description_p = String(repeating: "€", count: 200_000)
            await expectFailure(.resourceExhausted) { try await env.finance.createCharge(huge, options: a.options) }
            // Within it but wrong everywhere: every field named.
            var r = chargeRequest(h, 100, among: [b])
            r.description_p = String(repeating: "€", count: 2_000)
            r.householdId = String(repeating: "h", count: 1_000)
            r.housemateUserIds = Array(repeating: b.id, count: 500)
            r.idempotencyKey = "key\twith\ttabs"
            await expectFailure(
                .invalidArgument,
                fields: ["household_id", "description", "housemate_user_ids", "idempotency_key"] + (0..<19).map { "housemate_user_ids[\($0 + 1)]" }
            ) { try await env.finance.createCharge(r, options: a.options) }
            var control = chargeRequest(h, 100, among: [b])
            control.description_p = "bell\u{7}"
            await expectFailure(.invalidArgument, fields: ["description"]) { try await env.finance.createCharge(control, options: a.options) }
            var maxed = chargeRequest(h, .max, among: [b])
            maxed.amount.currency = "€UR"
            await expectFailure(.invalidArgument, fields: ["amount", "amount.currency"]) {
                try await env.finance.createCharge(maxed, options: a.options)
            }
            // Bytes that are not a CreateChargeRequest.
            let raw = RawMessage(bytes: [0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x42])
            do {
                _ = try await env.server.anonymous.unary(Finance_V1_FinanceMethods.createCharge, raw, as: RawMessage.self, options: a.options)
                Issue.record("garbage accepted")
            } catch let e as RPCError {
                #expect([.invalidArgument, .internal].contains(e.code), "\(e)")
            }
            // The service is fine afterwards, and nothing was written.
            #expect(try await env.verify(h).entriesChecked == 0)
            #expect(try await env.finance.createCharge(chargeRequest(h, 100, among: [b]), options: a.options).transaction.total.amountCents == 100)
        }
    }

    @Test func manyWritersOnTheSamePairsKeepBalancesEqualToHistory() async throws {
        try await withFinance { env in
            let users = try await (0..<4).asyncMap { _ in try await env.user() }
            let h = try await env.household(users)
            let finance = env.finance
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (i, u) in users.enumerated() {
                    let others = users.filter { $0.id != u.id }
                    group.addTask {
                        for n in 0..<40 {
                            if n % 3 == 0 {
                                _ = try await finance.createPayment(paymentRequest(h, Int64(101 + n + i), among: others), options: u.options)
                            } else {
                                _ = try await finance.createCharge(chargeRequest(h, Int64(997 + n * i), among: others), options: u.options)
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            var total: Int64 = 0
            for u in users {
                let balances = try await env.balances(u, h)
                total += balances.values.reduce(0, +)
                for (other, cents) in balances {
                    let history = try await env.history(u, with: other, h)
                    #expect(history.map(\.amount.amountCents).reduce(0, +) == cents)
                    #expect(history.first?.balanceAfter.amountCents ?? 0 == cents)
                }
            }
            #expect(total == 0)
            let v = try await env.verify(h)
            #expect(v.verified && v.entriesChecked == 160)
        }
    }
}
