import Contracts
import Finance
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Testing

/// Issue 35: every amount, count and enum number a client sends finance is checked for range
/// before any arithmetic, answered INVALID_ARGUMENT naming the field. A trap would end this test
/// process (and, in production, the service); afterwards nothing was written.
@Suite("Finance: numbers at their extremes")
struct NumberRangeTests {
    static let extremes: [Int64] = [.max, .min, -1, 0, MoneyRules.maxRequestCents + 1]

    @Test func amountsAtTheInt64ExtremesAreNamed() async throws {
        try await withFinance { env in
            let (a, b, c) = (try await env.user(), try await env.user(), try await env.user())
            let h = try await env.household([a, b, c])
            for cents in Self.extremes {
                for mode: Finance_V1_SplitMode in [.equal, .each] {
                    await expectFailure(.invalidArgument, fields: ["amount"], "charge \(cents) \(mode)") {
                        try await env.finance.createCharge(chargeRequest(h, cents, among: [b, c], mode: mode), options: a.options)
                    }
                    await expectFailure(.invalidArgument, fields: ["amount"], "payment \(cents) \(mode)") {
                        try await env.finance.createPayment(paymentRequest(h, cents, among: [b, c], mode: mode), options: a.options)
                    }
                }
                // Custom shares: each share is checked before they are added up.
                var custom = chargeRequest(h, 1000, among: [], mode: .custom)
                custom.customShares = [share(b, cents), share(c, cents)]
                await expectFailure(.invalidArgument, fields: ["custom_shares[0].amount", "custom_shares[1].amount"], "shares \(cents)") {
                    try await env.finance.createCharge(custom, options: a.options)
                }
                await expectFailure(.invalidArgument, fields: ["amount"], "repayment \(cents)") {
                    try await env.finance.recordRepayment(repaymentRequest(h, to: b.id, cents), options: a.options)
                }
                var settlement = Finance_V1_RecordTaskSettlementRequest()
                settlement.idempotencyKey = "tasks:settle:range"
                settlement.taskId = "task-range"
                settlement.requesterUserId = a.id
                settlement.providerUserId = b.id
                settlement.amount = money(cents)
                settlement.description_p = "Mow the lawn"
                await expectFailure(.invalidArgument, fields: ["amount"], "settlement \(cents)") {
                    try await env.internalAPI.recordTaskSettlement(settlement)
                }
            }
            // The largest amount each share may carry, twenty times over (EACH): within Int64.
            var each = chargeRequest(h, MoneyRules.maxRequestCents, among: [b, c], mode: .each)
            each.splitMode = .unrecognized(.max)
            await expectFailure(.invalidArgument, fields: ["split_mode"]) { try await env.finance.createCharge(each, options: a.options) }
            each.splitMode = .unrecognized(.min)
            await expectFailure(.invalidArgument, fields: ["split_mode"]) { try await env.finance.createCharge(each, options: a.options) }
            // Nothing was written, and the service still serves.
            #expect(try await env.verify(h).entriesChecked == 0)
            each.splitMode = .each
            let t = try await env.finance.createCharge(each, options: a.options).transaction
            #expect(t.total.amountCents == 2 * MoneyRules.maxRequestCents)
        }
    }

    @Test func pageSizesAtTheInt32ExtremesAreRefusedOrClamped() async throws {
        try await withFinance { env in
            let (a, b) = (try await env.user(), try await env.user())
            let h = try await env.household([a, b])
            _ = try await env.finance.createCharge(chargeRequest(h, 100, among: [b]), options: a.options)
            var r = Finance_V1_ListTransactionsRequest()
            r.householdId = h
            r.counterpartUserId = b.id
            for size: Int32 in [-1, .min] {
                r.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.finance.listTransactions(r, options: a.options) }
            }
            r.pageSize = .max  // clamped to 100
            let entries = try await env.finance.listTransactions(r, options: a.options).entries
            #expect(entries.count == 1)
        }
    }
}
