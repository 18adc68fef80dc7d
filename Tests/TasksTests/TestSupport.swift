import Accounts
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

@testable import Tasks

// The world a tasks test runs in, all over real gRPC on loopback with real SQLite files: the REAL
// accounts service (in process: usernames, names, access tokens), a tasks server, the tasks
// outbox delivered to the peers as in production, and — until social lands on main — a minimal
// social double (below, clearly marked) that answers memberships and teams and records the
// notifications and scores tasks sends it.

/// TEST DOUBLE of `social.v1.SocialInternal` (only what tasks calls): households and their
/// members, users' teams, and a record of every SendNotification and RecordTeamTaskCompleted it
/// received, deduplicated by event id as social does. `down` makes every call fail UNAVAILABLE
/// (a peer that cannot answer). Replaced by the real social-service once it is on main.
final class SocialDouble: Social_V1_SocialInternalService {
    struct Household {
        var members: [String]
        var deleted = false
    }
    struct State {
        var households: [String: Household] = [:]
        var teams: [String: String] = [:]
        var notifications: [Social_V1_SendNotificationRequest] = []
        var seenEvents = Set<String>()
        var scores: [String: Int64] = [:]
        var scoredTasks = Set<String>()
        var scoreCalls = 0
        var down = false
        /// "follower>followed" pairs (accepted follows); blocks drop them as social does.
        var follows = Set<String>()
        var blocks = Set<String>()
    }
    let state = Mutex(State())

    func check() throws { if state.withLock({ $0.down }) { throw RPCError(.unavailable, "social double is down") } }

    func addHousehold(_ id: String = "hh_" + ULID.make(), members: [String]) -> String {
        state.withLock { $0.households[id] = Household(members: members) }
        return id
    }
    func setTeam(_ team: String, for users: [String]) { state.withLock { s in for u in users { s.teams[u] = team } } }
    var notifications: [Social_V1_SendNotificationRequest] { state.withLock { $0.notifications } }
    func notifications(to user: String, kind: Social_V1_NotificationKind? = nil) -> [Social_V1_SendNotificationRequest] {
        notifications.filter { $0.recipientUserIds.contains(user) && (kind == nil || $0.kind == kind!) }
    }
    func score(_ team: String) -> Int64 { state.withLock { $0.scores[team] ?? 0 } }
    var down: Bool {
        get { state.withLock { $0.down } }
        set { state.withLock { $0.down = newValue } }
    }

    func sendNotification(request: Social_V1_SendNotificationRequest, context: ServerContext) async throws -> Social_V1_SendNotificationResponse {
        try check()
        var r = Social_V1_SendNotificationResponse()
        r.replayed = state.withLock { s in
            guard s.seenEvents.insert(request.eventId).inserted else { return true }
            s.notifications.append(request)
            return false
        }
        return r
    }
    func follow(_ follower: String, _ followed: String) { _ = state.withLock { $0.follows.insert("\(follower)>\(followed)") } }
    /// `blocker` blocks `blocked`: follows both ways go, as in social.
    func block(_ blocker: String, _ blocked: String) {
        state.withLock { s in
            s.blocks.insert("\(blocker)>\(blocked)")
            s.follows.remove("\(blocker)>\(blocked)")
            s.follows.remove("\(blocked)>\(blocker)")
        }
    }
    func checkRelationship(request: Social_V1_CheckRelationshipRequest, context: ServerContext) async throws -> Social_V1_CheckRelationshipResponse {
        try check()
        let (a, b) = (request.userId, request.otherUserId)
        var r = Social_V1_CheckRelationshipResponse()
        state.withLock { s in
            r.userFollowsOther = s.follows.contains("\(a)>\(b)")
            r.otherFollowsUser = s.follows.contains("\(b)>\(a)")
            r.userBlocksOther = s.blocks.contains("\(a)>\(b)")
            r.otherBlocksUser = s.blocks.contains("\(b)>\(a)")
        }
        return r
    }
    func listFollowedUserIds(
        request: Social_V1_ListFollowedUserIdsRequest, context: ServerContext
    ) async throws -> Social_V1_ListFollowedUserIdsResponse {
        try check()
        var r = Social_V1_ListFollowedUserIdsResponse()
        r.userIds = state.withLock { s in
            s.follows.filter { $0.hasPrefix(request.userId + ">") }.map { String($0.dropFirst(request.userId.count + 1)) }.sorted()
        }
        return r
    }
    func checkHouseholdMembership(
        request: Social_V1_CheckHouseholdMembershipRequest, context: ServerContext
    ) async throws -> Social_V1_CheckHouseholdMembershipResponse {
        try check()
        guard let h = state.withLock({ $0.households[request.householdId] }) else { throw RPCError(.notFound, "no such household") }
        var r = Social_V1_CheckHouseholdMembershipResponse()
        r.state = h.deleted ? .deleted : .active
        r.memberUserIds = h.members
        for u in request.userIds { r.memberships[u] = h.members.contains(u) ? .member : .notMember }
        return r
    }
    func getTeamOfUser(request: Social_V1_GetTeamOfUserRequest, context: ServerContext) async throws -> Social_V1_GetTeamOfUserResponse {
        try check()
        var r = Social_V1_GetTeamOfUserResponse()
        if let t = state.withLock({ $0.teams[request.userId] }) { r.team.teamId = t }
        return r
    }
    func recordTeamTaskCompleted(
        request: Social_V1_RecordTeamTaskCompletedRequest, context: ServerContext
    ) async throws -> Social_V1_RecordTeamTaskCompletedResponse {
        try check()
        var r = Social_V1_RecordTeamTaskCompletedResponse()
        state.withLock { s in
            s.scoreCalls += 1
            if s.seenEvents.insert(request.eventId).inserted, s.scoredTasks.insert(request.teamId + "/" + request.taskId).inserted {
                s.scores[request.teamId, default: 0] += Int64(request.points)
            } else {
                r.replayed = true
            }
            r.teamScore = s.scores[request.teamId] ?? 0
        }
        return r
    }
    func eraseUser(request: Social_V1_EraseUserRequest, context: ServerContext) async throws -> Social_V1_EraseUserResponse {
        Social_V1_EraseUserResponse()
    }
}

/// TEST DOUBLE of `finance.v1.FinanceInternal` (only what tasks calls): RecordTaskSettlement,
/// one per task as finance keeps it, with every call counted. `down` answers UNAVAILABLE. The
/// process tests use the real finance-service.
final class FinanceDouble: Finance_V1_FinanceInternalService {
    struct State {
        var settlements: [String: Finance_V1_RecordTaskSettlementRequest] = [:]
        var calls = 0
        var down = false
    }
    let state = Mutex(State())
    var settlements: [String: Finance_V1_RecordTaskSettlementRequest] { state.withLock { $0.settlements } }
    var calls: Int { state.withLock { $0.calls } }
    var down: Bool {
        get { state.withLock { $0.down } }
        set { state.withLock { $0.down = newValue } }
    }
    func recordTaskSettlement(
        request: Finance_V1_RecordTaskSettlementRequest, context: ServerContext
    ) async throws -> Finance_V1_RecordTaskSettlementResponse {
        var r = Finance_V1_RecordTaskSettlementResponse()
        try state.withLock { s in
            if s.down { throw RPCError(.unavailable, "finance double is down") }
            s.calls += 1
            if s.settlements[request.taskId] != nil { r.replayed = true } else { s.settlements[request.taskId] = request }
        }
        return r
    }
    func eraseUser(request: Finance_V1_EraseUserRequest, context: ServerContext) async throws -> Finance_V1_EraseUserResponse {
        Finance_V1_EraseUserResponse()
    }
    func verifyLedger(request: Finance_V1_VerifyLedgerRequest, context: ServerContext) async throws -> Finance_V1_VerifyLedgerResponse {
        throw RPCError(.unimplemented, "not in the double")
    }
}

/// A user of a test: id, username and access token from the real accounts.
struct User: Sendable {
    var id: String
    var username: String
    var displayName: String
    var token: String
    var options: CallOptions { bearer(token) }
}

let nameCounter = Mutex(0)
func uniqueName(_ prefix: String = "user") -> String {
    "\(prefix)\(nameCounter.withLock { $0 += 1; return $0 })_\(SecureRandom.token(bytes: 3).lowercased().filter { $0.isLetter || $0.isNumber })"
}

/// accounts + social double + tasks, in process over real gRPC; `stop()` ends everything.
final class World: Sendable {
    let directory: TemporaryDirectory
    let accountsCore: AccountsCore
    let accountsServer: TestServer
    let social: SocialDouble
    let socialServer: TestServer
    let finance: FinanceDouble
    let financeServer: TestServer
    let core: TasksCore
    let server: TestServer
    let clock: ManualClock
    let delivery: Task<Void, Never>

    /// A client channel that takes 5 MiB attachments back (the default cap is 4 MiB).
    let channel: RPCChannel
    var tasks: Tasks_V1_TasksClient { Tasks_V1_TasksClient(channel.client) }
    var internalAPI: Tasks_V1_TasksInternalClient { Tasks_V1_TasksInternalClient(server.service) }
    var accounts: Accounts_V1_AccountsClient { Accounts_V1_AccountsClient(accountsServer.anonymous) }

    private init(
        directory: TemporaryDirectory, accountsCore: AccountsCore, accountsServer: TestServer, social: SocialDouble, socialServer: TestServer,
        finance: FinanceDouble, financeServer: TestServer, core: TasksCore, server: TestServer, clock: ManualClock, delivery: Task<Void, Never>
    ) {
        self.directory = directory
        self.accountsCore = accountsCore
        self.accountsServer = accountsServer
        self.social = social
        self.socialServer = socialServer
        self.finance = finance
        self.financeServer = financeServer
        self.core = core
        self.server = server
        self.clock = clock
        self.delivery = delivery
        var c = ChannelConfiguration(host: "127.0.0.1", port: server.port)
        c.maxReceiveMessageSize = 8 << 20
        channel = RPCChannel(configuration: c)
    }

    static func start(
        now: Int64 = SystemClock.nowMilliseconds(), socialPort: Int? = nil, _ configure: (inout TasksConfiguration) -> Void = { _ in }
    ) async throws -> World {
        let dir = TemporaryDirectory("tasks-tests")
        var ac = AccountsConfiguration(dataDirectory: dir.path + "/accounts")
        ac.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        let logger = Logger(label: "tasks-test")
        let accountsCore = try AccountsCore(configuration: ac, logger: logger)
        let accountsServer = try await TestServer(services: accountsCore.services, keys: accountsCore.signingKeySource)
        let social = SocialDouble()
        let socialServer = try await TestServer(services: [social], keys: accountsCore.signingKeySource)
        let finance = FinanceDouble()
        let financeServer = try await TestServer(services: [finance], keys: accountsCore.signingKeySource)
        let accountsPort = accountsServer.port, realSocialPort = socialPort ?? socialServer.port, financePort = financeServer.port
        let peers = PeerClients { peer in
            TestServer.peerClient(
                port: peer == "accounts" ? accountsPort : peer == "social" ? realSocialPort : peer == "finance" ? financePort : 1)
        }
        var config = TasksConfiguration(dataDirectory: dir.path + "/tasks")
        config.membershipCacheFor = .zero
        config.peerDeadline = .milliseconds(1500)
        configure(&config)
        let clock = ManualClock(milliseconds: now)
        let core = try TasksCore(configuration: config, peers: peers, clock: clock, logger: logger)
        let maxRequest = config.maxRequestBytes
        let server = try await TestServer(services: core.services, keys: accountsCore.signingKeySource) { c in
            c.maxReceiveMessageSize = maxRequest
        }
        let outbox = OutboxDelivery(
            database: core.database, retry: OutboxRetryPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(200)),
            pollInterval: .milliseconds(100), logger: logger, deliver: OutboxSenders.rpc(peers: peers, timeout: .seconds(5)).deliver)
        let delivery = Task { await outbox.run() }
        return World(
            directory: dir, accountsCore: accountsCore, accountsServer: accountsServer, social: social, socialServer: socialServer,
            finance: finance, financeServer: financeServer, core: core, server: server, clock: clock, delivery: delivery)
    }

    func stop() async {
        delivery.cancel()
        _ = await delivery.value
        await channel.close()
        await server.stop()
        await socialServer.stop()
        await financeServer.stop()
        await accountsServer.stop()
        core.close()
        accountsCore.close()
        directory.remove()
    }

    /// A new user (real sign-up in accounts).
    func user(_ prefix: String = "user", displayName: String? = nil) async throws -> User {
        let name = uniqueName(prefix)
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = "\(name)@example.com"
        r.password = "correct horse battery staple"
        r.displayName = displayName ?? name.capitalized
        let s = try await accounts.signUp(r)
        return User(id: s.user.userId, username: name, displayName: r.displayName, token: s.session.accessToken)
    }

    func users(_ n: Int, _ prefix: String = "user") async throws -> [User] {
        var out: [User] = []
        for _ in 0..<n { out.append(try await user(prefix)) }
        return out
    }

    /// Waits until every outbox event was delivered.
    func outboxDrained(timeout: Duration = .seconds(10)) async throws -> Bool {
        let db = core.database
        return try await eventually(timeout: timeout) { try await db.pendingOutbox(limit: 10).isEmpty }
    }
}

/// Runs `body` in a fresh world and always stops it.
func withWorld(
    now: Int64 = SystemClock.nowMilliseconds(), _ configure: (inout TasksConfiguration) -> Void = { _ in },
    _ body: (World) async throws -> Void
) async throws {
    let world = try await World.start(now: now, configure)
    do { try await body(world) } catch {
        await world.stop()
        throw error
    }
    await world.stop()
}

// MARK: Requests

func createTask(
    _ name: String = "Prepare the demo", description: String = "", with usernames: [String], key: String = UUID().uuidString
)
    -> Tasks_V1_CreateTeamTaskRequest
{
    var r = Tasks_V1_CreateTeamTaskRequest()
    r.idempotencyKey = key
    r.name = name
    r.description_p = description
    r.participantUsernames = usernames
    return r
}

func date(_ y: Int, _ m: Int, _ d: Int) -> Common_V1_Date {
    var r = Common_V1_Date()
    r.year = Int32(y)
    r.month = Int32(m)
    r.day = Int32(d)
    return r
}

func weekly(_ days: [Common_V1_Weekday] = []) -> Tasks_V1_ChoreRecurrence {
    var w = Tasks_V1_ChoreWeekly()
    w.weekdays = days
    var r = Tasks_V1_ChoreRecurrence()
    r.kind = .weekly(w)
    return r
}

func recurrence(_ kind: Tasks_V1_ChoreRecurrence.OneOf_Kind) -> Tasks_V1_ChoreRecurrence {
    var r = Tasks_V1_ChoreRecurrence()
    r.kind = kind
    return r
}

func createChore(
    household: String, name: String = "Take out the trash", due: Common_V1_Date, assignees: [String],
    recurrence: Tasks_V1_ChoreRecurrence = weekly(), zone: String = "Europe/London", key: String = UUID().uuidString
) -> Tasks_V1_CreateChoreRequest {
    var r = Tasks_V1_CreateChoreRequest()
    r.idempotencyKey = key
    r.householdId = household
    r.name = name
    r.dueDate = due
    r.assigneeUserIds = assignees
    r.recurrence = recurrence
    r.timeZone = zone
    return r
}

/// Unix milliseconds of a UTC date and time.
func utc(_ y: Int, _ m: Int, _ d: Int, _ h: Int = 12, _ min: Int = 0) -> Int64 {
    Int64(LocalDate(year: y, month: m, day: d).dayNumber) * 86_400_000 + Int64(h) * 3_600_000 + Int64(min) * 60_000
}
