import Accounts
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

@testable import Tasks

// The world a tasks test runs in, all over real gRPC on loopback with real SQLite files
// (ServiceCluster): the REAL accounts (usernames, names, access tokens), the REAL social
// (households, teams, follows and blocks, notifications, scores) and the REAL finance (marketplace
// settlements) in this process, the tasks server under test on a manual clock, and each service's
// outbox delivered to its peers as in production. Households, teams, follows and blocks are made
// through social's API; what tasks told social is read back from social (recipients' inboxes,
// team scores), and what it told finance from finance (the two users' marketplace history).

/// A user of a test: id, username, email and access token from the real accounts.
typealias User = ClusterUser

/// What a notification said, as the recipient's inbox in social shows it.
extension Social_V1_Notification {
    var actorUserId: String { actor.userId }
}

/// accounts + social + finance + tasks, in process over real gRPC; `stop()` ends everything.
final class World: Sendable {
    let cluster: ServiceCluster
    let clock: ManualClock

    /// A client channel that takes 5 MiB attachments back (the default cap is 4 MiB).
    let channel: RPCChannel
    var tasks: Tasks_V1_TasksClient { Tasks_V1_TasksClient(channel.client) }
    var internalAPI: Tasks_V1_TasksInternalClient { cluster.tasksInternal }
    var accounts: Accounts_V1_AccountsClient { cluster.accounts }
    var core: TasksCore { cluster.tasksCore! }
    var server: TestServer { cluster.server(.tasks) }
    var finance: Finance_V1_FinanceClient { cluster.finance }
    var financeInternal: Finance_V1_FinanceInternalClient { cluster.financeInternal }

    private init(cluster: ServiceCluster, clock: ManualClock) {
        self.cluster = cluster
        self.clock = clock
        var c = ChannelConfiguration(host: "127.0.0.1", port: cluster.port(.tasks))
        c.maxReceiveMessageSize = 8 << 20
        channel = RPCChannel(configuration: c)
    }

    static func start(
        now: Int64 = SystemClock.nowMilliseconds(), _ configure: @escaping @Sendable (inout TasksConfiguration) -> Void = { _ in }
    ) async throws -> World {
        let clock = ManualClock(milliseconds: now)
        var options = ClusterOptions([.accounts, .social, .finance, .tasks])
        options.clocks[.tasks] = clock
        options.tasks = configure
        options.logger = Logger(label: "tasks-test") { _ in SwiftLogNoOpLogHandler() }
        return World(cluster: try await ServiceCluster.start(options), clock: clock)
    }

    func stop() async {
        await channel.close()
        await cluster.stop()
    }

    /// A new user (real sign-up in accounts).
    func user(_ prefix: String = "user", displayName: String? = nil) async throws -> User {
        try await cluster.signUp(prefix: prefix, displayName: displayName)
    }

    func users(_ n: Int, _ prefix: String = "user") async throws -> [User] {
        var out: [User] = []
        for _ in 0..<n { out.append(try await user(prefix)) }
        return out
    }

    /// A household in social: the first member creates it, the others join with the codes
    /// accounts mailed them. Returns its id.
    func household(_ members: [User]) async throws -> String { try await cluster.household(members) }

    /// `member` deletes the household in social (whose outbox then ends its chores in tasks).
    func deleteHousehold(_ household: String, by member: User) async throws { try await cluster.deleteHousehold(household, by: member) }

    /// A team in social (the first member creates it with the others); returns its id.
    func team(_ members: [User]) async throws -> String { try await cluster.team(members) }

    /// The score of `member`'s team, as social keeps it.
    func teamScore(of member: User) async throws -> Int64 { try await cluster.teamScore(of: member) }

    /// `follower` asks to follow `followed` in social, who accepts: `follower` follows them.
    func follow(_ follower: User, _ followed: User) async throws { try await cluster.follow(follower, followed) }

    /// `blocker` blocks `blocked` in social (which drops the follows between them both ways).
    func block(_ blocker: User, _ blocked: User) async throws { try await cluster.block(blocker, blocked) }

    /// social refuses every call (UNAVAILABLE) while down: a peer that cannot answer.
    func setSocialDown(_ down: Bool) { cluster.setDown(.social, down) }

    /// finance refuses every call (UNAVAILABLE) while down, the test's reads included.
    func setFinanceDown(_ down: Bool) { cluster.setDown(.finance, down) }

    /// `user`'s marketplace history with `other` in finance (settlements of done tasks), newest first.
    func settlements(of user: User, with other: User) async throws -> [Finance_V1_TransactionEntry] {
        try await cluster.transactions(of: user, with: other)
    }

    /// `user`'s marketplace balances in finance (one per counterpart and currency).
    func marketBalances(of user: User) async throws -> [Finance_V1_Balance] { try await cluster.balances(of: user) }

    /// The settlements tasks asked finance for that wait in tasks' outbox (not acknowledged yet).
    func pendingSettlements() async throws -> [OutboxEvent] {
        try await core.database.pendingOutbox(limit: 1000).filter { $0.destination == "finance" }
    }

    /// The notifications in `user`'s inbox at social (of `kind`), oldest first.
    func notifications(to user: User, kind: Social_V1_NotificationKind? = nil) async throws -> [Social_V1_Notification] {
        try await cluster.notifications(of: user, kinds: kind.map { [$0] } ?? []).reversed()
    }

    /// Waits until every outbox event was delivered (social acknowledged it: it is in the inboxes).
    func outboxDrained(timeout: Duration = .seconds(10)) async throws -> Bool {
        let db = core.database
        return try await eventually(timeout: timeout) { try await db.pendingOutbox(limit: 10).isEmpty }
    }
}

/// Runs `body` in a fresh world and always stops it.
func withWorld(
    now: Int64 = SystemClock.nowMilliseconds(), _ configure: @escaping @Sendable (inout TasksConfiguration) -> Void = { _ in },
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
