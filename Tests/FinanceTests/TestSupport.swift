import Accounts
import Contracts
import Finance
import Foundation
import Logging
import RPCCore
import RPCServices
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

// What the finance tests share: a real accounts (in-process, for users, tokens and display names),
// a social peer TEST DOUBLE (below), and the finance service under test, each on 127.0.0.1:0 behind
// the kit's access policy, talking real gRPC; finance's outbox delivered to the double as in
// production (OutboxSenders.rpc).

/// PEER TEST DOUBLE of `social.v1.SocialInternal` — only `CheckHouseholdMembership` and
/// `SendNotification`, the two calls finance makes. It stands in for the social service (being
/// built on another branch) until that lands in main; households are set by the test. It keeps
/// SendNotification idempotent by event id as social's contract says, and records every delivery.
final class SocialDouble: Social_V1_SocialInternalService, Sendable {
    struct Household: Sendable {
        var state: Social_V1_HouseholdState = .active
        var members: [String]
        var formers: [String] = []
    }
    let households = Mutex<[String: Household]>([:])
    /// event id → request (first delivery), and how many deliveries arrived in all.
    let notifications = Mutex<[String: Social_V1_SendNotificationRequest]>([:])
    let deliveries = Atomic<Int>(0)
    /// Membership answers wait this long (a slow peer).
    let delay = Mutex<Duration>(.zero)
    let membershipCalls = Atomic<Int>(0)

    func set(_ id: String, _ h: Household) { households.withLock { $0[id] = h } }

    func checkHouseholdMembership(
        request: Social_V1_CheckHouseholdMembershipRequest, context: ServerContext
    ) async throws -> Social_V1_CheckHouseholdMembershipResponse {
        membershipCalls.wrappingAdd(1, ordering: .relaxed)
        let wait = delay.withLock { $0 }
        if wait > .zero {
            let until = ContinuousClock.now + wait
            while ContinuousClock.now < until && !Task.isCancelled { try? await Task.sleep(for: .milliseconds(20)) }
        }
        guard let h = households.withLock({ $0[request.householdId] }) else { throw RPCError(.notFound, "no such household") }
        var r = Social_V1_CheckHouseholdMembershipResponse()
        r.state = h.state
        r.memberUserIds = h.members
        for u in request.userIds {
            r.memberships[u] = h.members.contains(u) ? .member : h.formers.contains(u) ? .formerMember : .notMember
        }
        return r
    }

    func sendNotification(request: Social_V1_SendNotificationRequest, context: ServerContext) async throws -> Social_V1_SendNotificationResponse {
        deliveries.wrappingAdd(1, ordering: .relaxed)
        let replayed = notifications.withLock { n in
            if n[request.eventId] != nil { return true }
            n[request.eventId] = request
            return false
        }
        var r = Social_V1_SendNotificationResponse()
        r.replayed = replayed
        return r
    }

    var received: [Social_V1_SendNotificationRequest] { notifications.withLock { Array($0.values) } }

    func checkRelationship(request: Social_V1_CheckRelationshipRequest, context: ServerContext) async throws -> Social_V1_CheckRelationshipResponse {
        throw RPCError(.unimplemented, "not part of the double")
    }
    func listFollowedUserIds(
        request: Social_V1_ListFollowedUserIdsRequest, context: ServerContext
    ) async throws -> Social_V1_ListFollowedUserIdsResponse {
        throw RPCError(.unimplemented, "not part of the double")
    }
    func getTeamOfUser(request: Social_V1_GetTeamOfUserRequest, context: ServerContext) async throws -> Social_V1_GetTeamOfUserResponse {
        throw RPCError(.unimplemented, "not part of the double")
    }
    func recordTeamTaskCompleted(
        request: Social_V1_RecordTeamTaskCompletedRequest, context: ServerContext
    ) async throws -> Social_V1_RecordTeamTaskCompletedResponse {
        throw RPCError(.unimplemented, "not part of the double")
    }
    func eraseUser(request: Social_V1_EraseUserRequest, context: ServerContext) async throws -> Social_V1_EraseUserResponse {
        throw RPCError(.unimplemented, "not part of the double")
    }
}

/// A user signed up with the real accounts: id and access token.
struct TestUser: Sendable {
    let id: String
    let token: String
    let username: String
    var options: CallOptions { bearer(token) }
}

let quietLogger = Logger(label: "finance-test") { _ in SwiftLogNoOpLogHandler() }

/// accounts (real), the social double and finance, on loopback; `stop()` ends all and removes data.
final class FinanceEnv: Sendable {
    let directory: TemporaryDirectory
    let accountsCore: AccountsCore
    let accounts: TestServer
    let social: SocialDouble
    let socialServer: Mutex<TestServer?>
    let socialPort: Int
    let core: FinanceCore
    let server: TestServer
    let peers: PeerClients
    let delivery: Task<Void, Never>
    let clock: ManualClock?
    private let accountsStopped = Mutex(false)

    static func start(clock: ManualClock? = nil, configure: (inout FinanceConfiguration) -> Void = { _ in }) async throws -> FinanceEnv {
        let directory = TemporaryDirectory("finance-tests")
        var ac = AccountsConfiguration(dataDirectory: directory.path + "/accounts")
        ac.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        ac.maxSignUpsPerAddress = 100_000
        let accountsCore = try AccountsCore(configuration: ac, logger: quietLogger)
        let accounts = try await TestServer(services: accountsCore.services, keys: accountsCore.signingKeySource, logger: quietLogger)
        let social = SocialDouble()
        let socialServer = try await TestServer(services: [social], keys: accountsCore.signingKeySource, logger: quietLogger)
        let socialPort = socialServer.port
        let accountsPort = accounts.port
        let peers = PeerClients { name in
            var c = ChannelConfiguration(host: "127.0.0.1", port: name == "social" ? socialPort : accountsPort)
            c.connectTimeout = .seconds(1)
            c.maxBackoff = .milliseconds(200)
            return RPCClient(transport: CredentialedTransport(base: RPCChannel(configuration: c), serviceToken: TestCredentials.serviceToken))
        }
        var fc = FinanceConfiguration(dataDirectory: directory.path + "/finance")
        fc.membershipTimeout = .milliseconds(800)
        configure(&fc)
        let core = try FinanceCore(configuration: fc, peers: peers, clock: clock ?? SystemClock(), logger: quietLogger)
        let server = try await TestServer(services: core.services, keys: accountsCore.signingKeySource, logger: quietLogger)
        let deliver = OutboxSenders.rpc(peers: peers, timeout: .seconds(2)).deliver
        let outbox = OutboxDelivery(
            database: core.database, retry: OutboxRetryPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(400)),
            pollInterval: .seconds(5), batchSize: 100, logger: quietLogger, deliver: deliver)
        let delivery = Task { await outbox.run() }
        return FinanceEnv(
            directory: directory, accountsCore: accountsCore, accounts: accounts, social: social,
            socialServer: socialServer, socialPort: socialPort, core: core, server: server, peers: peers,
            delivery: delivery, clock: clock)
    }

    private init(
        directory: TemporaryDirectory, accountsCore: AccountsCore, accounts: TestServer, social: SocialDouble,
        socialServer: TestServer, socialPort: Int, core: FinanceCore, server: TestServer, peers: PeerClients,
        delivery: Task<Void, Never>, clock: ManualClock?
    ) {
        self.directory = directory
        self.accountsCore = accountsCore
        self.accounts = accounts
        self.social = social
        self.socialServer = Mutex(socialServer)
        self.socialPort = socialPort
        self.core = core
        self.server = server
        self.peers = peers
        self.delivery = delivery
        self.clock = clock
    }

    var finance: Finance_V1_FinanceClient { Finance_V1_FinanceClient(server.anonymous) }
    var internalAPI: Finance_V1_FinanceInternalClient { Finance_V1_FinanceInternalClient(server.service) }

    /// Signs a user up with accounts.
    func user(_ username: String? = nil, displayName: String = "") async throws -> TestUser {
        let name = username ?? "u\(SecureRandom.token(bytes: 5).lowercased().filter { $0.isLetter || $0.isNumber })"
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = "\(name.replacingOccurrences(of: ".", with: "_"))@example.com"
        r.password = "correct horse battery staple"
        r.displayName = displayName
        let signed = try await Accounts_V1_AccountsClient(accounts.anonymous).signUp(r)
        return TestUser(id: signed.user.userId, token: signed.session.accessToken, username: name)
    }

    /// A household of `members` at the social double; returns its id.
    @discardableResult
    func household(_ members: [TestUser], formers: [TestUser] = [], id: String = ULID.make()) -> String {
        social.set(id, .init(members: members.map(\.id), formers: formers.map(\.id)))
        return id
    }

    /// Stops the social double (a peer that is down).
    func stopSocial() async {
        let s = socialServer.withLock { s in
            defer { s = nil }; return s
        }
        await s?.stop()
    }

    /// Starts the social double again on its port.
    func restartSocial() async throws {
        let port = socialPort
        let s = try await TestServer(services: [social], keys: accountsCore.signingKeySource, logger: quietLogger) { c in c.port = port }
        socialServer.withLock { $0 = s }
    }

    /// Stops accounts (a peer that is down); token keys stay known to the finance server.
    func stopAccounts() async {
        guard
            accountsStopped.withLock({ s in
                defer { s = true }; return !s
            })
        else { return }
        await accounts.stop()
    }

    func stop() async {
        delivery.cancel()
        _ = await delivery.value
        await server.stop()
        await stopSocial()
        await stopAccounts()
        await peers.close()
        core.close()
        accountsCore.close()
        directory.remove()
    }
}

/// Runs `body` against a fresh environment and always stops it.
func withFinance(
    clock: ManualClock? = nil, configure: (inout FinanceConfiguration) -> Void = { _ in },
    _ body: (FinanceEnv) async throws -> Void
) async throws {
    let env = try await FinanceEnv.start(clock: clock, configure: configure)
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

/// A file next to the test binary (the executables SwiftPM built with the tests).
func builtProduct(_ name: String) -> String {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
    while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
    return dir.appendingPathComponent(name).path
}
