import Accounts
import Contracts
import Finance
import Foundation
import Logging
import RPCCore
import RPCServices
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

// What the finance tests share: the REAL accounts and social and the finance service under test,
// all in this process (ServiceCluster: each on 127.0.0.1:0 behind the kit's access policy, real
// gRPC, real SQLite), finance's outbox delivered to social as in production. Households are made
// through social's API (invite codes from accounts' mail sink); notifications are read from the
// recipients' inboxes in social.

/// A user signed up with the real accounts: id, username, email and access token.
typealias TestUser = ClusterUser

let quietLogger = Logger(label: "finance-test") { _ in SwiftLogNoOpLogHandler() }

/// accounts, social and finance on loopback; `stop()` ends all and removes data.
final class FinanceEnv: Sendable {
    let cluster: ServiceCluster

    /// - Parameter slowSocial: finance (and a process a test starts) reaches social through a
    ///   `DelayProxy`, so that `setSocialDelay` can make the network to it slow.
    static func start(
        clock: ManualClock? = nil, slowSocial: Bool = false, configure: @escaping @Sendable (inout FinanceConfiguration) -> Void = { _ in }
    ) async throws -> FinanceEnv {
        var options = ClusterOptions([.accounts, .social, .finance])
        if let clock { options.clocks[.finance] = clock }
        if slowSocial { options.proxied = [.social] }
        options.finance = configure
        options.logger = quietLogger
        return FinanceEnv(cluster: try await ServiceCluster.start(options))
    }

    private init(cluster: ServiceCluster) { self.cluster = cluster }

    var core: FinanceCore { cluster.financeCore! }
    var server: TestServer { cluster.server(.finance) }
    var accounts: TestServer { cluster.server(.accounts) }
    /// Where finance reaches social (its proxy when slowable): a finance process gets it as SOCIAL_ADDR.
    var socialPort: Int { cluster.peerPort(.social) }
    var finance: Finance_V1_FinanceClient { cluster.finance }
    var internalAPI: Finance_V1_FinanceInternalClient { cluster.financeInternal }

    /// Signs a user up with accounts.
    func user(_ username: String? = nil, displayName: String = "") async throws -> TestUser {
        try await cluster.signUp(username, displayName: displayName)
    }

    /// A household in social: `members` (the first creates it, the others join with the code
    /// mailed to them), then `formers` join and leave. Returns its id.
    @discardableResult
    func household(_ members: [TestUser], formers: [TestUser] = []) async throws -> String {
        let h = try await cluster.household(members + formers)
        for f in formers { try await cluster.leave(h, f) }
        return h
    }

    /// `user` joins the household (invited by `by`).
    func join(_ household: String, _ user: TestUser, invitedBy by: TestUser) async throws {
        try await cluster.join(household, user, invitedBy: by)
    }

    /// `user` leaves the household (a former member from then on).
    func leave(_ household: String, _ user: TestUser) async throws { try await cluster.leave(household, user) }

    /// `member` deletes the household in social.
    func deleteHousehold(_ household: String, by member: TestUser) async throws {
        try await cluster.deleteHousehold(household, by: member)
    }

    /// The current members of a household, as social answers finance.
    func members(_ household: String) async throws -> [String] { try await cluster.membership(household).memberUserIds }

    /// The money notification about `transaction` in `user`'s inbox at social, once it arrived.
    func moneyNotification(
        to user: TestUser, about transaction: String, timeout: Duration = .seconds(10)
    ) async throws
        -> Social_V1_Notification?
    {
        try await cluster.waitForNotifications(of: user, kinds: [.moneyRecorded], timeout: timeout) {
            $0.target.transactionId == transaction
        }.first
    }

    /// The money notifications about `transaction` in `user`'s inbox now (no waiting).
    func moneyNotifications(of user: TestUser, about transaction: String) async throws -> [Social_V1_Notification] {
        try await cluster.notifications(of: user, kinds: [.moneyRecorded]).filter { $0.target.transactionId == transaction }
    }

    /// social refuses every call (UNAVAILABLE) until `restartSocial`: a peer that is down.
    func stopSocial() { cluster.setDown(.social, true) }
    func restartSocial() { cluster.setDown(.social, false) }
    /// Bytes between finance and social wait this long each way (needs `slowSocial`).
    func setSocialDelay(_ d: Duration) { cluster.setDelay(.social, d) }

    /// accounts refuses every call (a peer that is down); token keys stay known to finance.
    func stopAccounts() { cluster.setDown(.accounts, true) }

    func stop() async { await cluster.stop() }
}

/// Runs `body` against a fresh environment and always stops it.
func withFinance(
    clock: ManualClock? = nil, slowSocial: Bool = false, configure: @escaping @Sendable (inout FinanceConfiguration) -> Void = { _ in },
    _ body: (FinanceEnv) async throws -> Void
) async throws {
    let env = try await FinanceEnv.start(clock: clock, slowSocial: slowSocial, configure: configure)
    do { try await body(env) } catch {
        await env.stop()
        throw error
    }
    await env.stop()
}

// MARK: Requests

func money(_ cents: Int64, _ currency: String = "EUR") -> Common_V1_Money {
    var m = Common_V1_Money()
    m.amountCents = cents
    m.currency = currency
    return m
}

func chargeRequest(
    _ household: String, _ cents: Int64, among users: [TestUser], mode: Finance_V1_SplitMode = .equal,
    currency: String = "EUR", description: String = "Groceries", key: String = UUID().uuidString
) -> Finance_V1_CreateChargeRequest {
    var r = Finance_V1_CreateChargeRequest()
    r.householdId = household
    r.description_p = description
    r.amount = money(cents, currency)
    r.splitMode = mode
    r.housemateUserIds = users.map(\.id)
    r.idempotencyKey = key
    return r
}

func paymentRequest(
    _ household: String, _ cents: Int64, among users: [TestUser], mode: Finance_V1_SplitMode = .equal,
    currency: String = "EUR", description: String = "Rent", key: String = UUID().uuidString
) -> Finance_V1_CreatePaymentRequest {
    var r = Finance_V1_CreatePaymentRequest()
    r.householdId = household
    r.description_p = description
    r.amount = money(cents, currency)
    r.splitMode = mode
    r.housemateUserIds = users.map(\.id)
    r.idempotencyKey = key
    return r
}

func share(_ user: TestUser, _ cents: Int64, _ currency: String = "EUR") -> Finance_V1_Share {
    var s = Finance_V1_Share()
    s.userId = user.id
    s.amount = money(cents, currency)
    return s
}

func repaymentRequest(
    _ household: String, to payee: String, _ cents: Int64, currency: String = "EUR",
    key: String = UUID().uuidString
) -> Finance_V1_RecordRepaymentRequest {
    var r = Finance_V1_RecordRepaymentRequest()
    r.householdId = household
    r.payeeUserId = payee
    r.amount = money(cents, currency)
    r.idempotencyKey = key
    return r
}

extension FinanceEnv {
    /// The caller's balances in a household as [counterpart id: cents].
    func balances(_ user: TestUser, _ household: String) async throws -> [String: Int64] {
        var r = Finance_V1_GetBalancesRequest()
        r.householdId = household
        let b = try await finance.getBalances(r, options: user.options)
        return Dictionary(b.balances.map { ($0.counterpart.userId, $0.amount.amountCents) }, uniquingKeysWith: +)
    }

    /// The whole history of `user` with `other` (every page).
    func history(_ user: TestUser, with other: String, _ household: String, pageSize: Int32 = 100) async throws -> [Finance_V1_TransactionEntry] {
        var out: [Finance_V1_TransactionEntry] = []
        var token = ""
        repeat {
            var r = Finance_V1_ListTransactionsRequest()
            r.householdId = household
            r.counterpartUserId = other
            r.pageSize = pageSize
            r.pageToken = token
            let page = try await finance.listTransactions(r, options: user.options)
            out += page.entries
            token = page.nextPageToken
        } while !token.isEmpty
        return out
    }

    func verify(_ household: String) async throws -> Finance_V1_VerifyLedgerResponse {
        var r = Finance_V1_VerifyLedgerRequest()
        r.householdId = household
        return try await internalAPI.verifyLedger(r)
    }
}
