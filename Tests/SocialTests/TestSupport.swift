import Accounts
import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Synchronization
import Testing

// Real components over real gRPC on loopback (ServiceCluster): the real accounts (cheap scrypt)
// as social's peer, token issuer and mail sink; the real tasks as social's chores peer (unless a
// test runs without it); social under test on a manual clock; every outbox delivered to its
// peers as the host does it.

/// A port nothing listens on (a peer that is down), held for the whole test process.
func closedPort() -> Int { ClosedPort.process }

/// A signed-up user: id, username, email, access token.
typealias User = ClusterUser

extension ClusterUser {
    var ref: Common_V1_UserRef {
        var r = Common_V1_UserRef()
        r.userId = id
        r.username = username
        r.displayName = displayName
        return r
    }
    var selector: Social_V1_UserSelector {
        var s = Social_V1_UserSelector()
        s.username = username
        return s
    }
}

let nameCounter = Mutex(0)
func uniqueName(_ prefix: String = "u") -> String {
    "\(prefix)\(nameCounter.withLock { $0 += 1; return $0 })x\(SecureRandom.token(bytes: 3).lowercased().filter { $0.isLetter || $0.isNumber })"
}

/// accounts + social (+ tasks) on loopback, fresh data directories, a manual clock for social
/// (tests move time: invite expiry, snoozes, token expiry) and one for tasks.
final class SocialEnv: Sendable {
    let cluster: ServiceCluster
    let clock: ManualClock
    let tasksClock: ManualClock

    var core: SocialCore { cluster.socialCore! }
    var server: TestServer { cluster.server(.social) }
    var social: Social_V1_SocialClient { cluster.social }
    var internalAPI: Social_V1_SocialInternalClient { cluster.socialInternal }
    var accounts: Accounts_V1_AccountsClient { cluster.accounts }
    var accountsInternal: Accounts_V1_AccountsInternalClient { cluster.accountsInternal }
    /// tasks' public API (chores), when it runs.
    var tasks: Tasks_V1_TasksClient { cluster.tasks }

    private init(cluster: ServiceCluster, clock: ManualClock, tasksClock: ManualClock) {
        self.cluster = cluster
        self.clock = clock
        self.tasksClock = tasksClock
    }

    /// - Parameters: tasksUp: whether the real tasks runs (else social's tasks peer is down);
    ///   accountsDown: social's accounts peer points at a closed port (accounts still issues tokens).
    static func start(
        tasksUp: Bool = true, accountsDown: Bool = false,
        _ configure: @escaping @Sendable (inout SocialConfiguration) -> Void = { _ in }
    ) async throws -> SocialEnv {
        // SOCIAL_TEST_LOG=1 shows the services' logs (stderr) when a test needs explaining.
        let logger =
            ProcessInfo.processInfo.environment["SOCIAL_TEST_LOG"] == "1"
            ? Logger(label: "social-test") { StreamLogHandler.standardError(label: $0) }
            : Logger(label: "social-test") { _ in SwiftLogNoOpLogHandler() }
        let clock = ManualClock(), tasksClock = ManualClock()
        var options = ClusterOptions(tasksUp ? [.accounts, .social, .tasks] : [.accounts, .social])
        options.clocks = [.social: clock, .tasks: tasksClock]
        if accountsDown { options.unreachable = [.accounts] }
        options.social = configure
        options.logger = logger
        return SocialEnv(cluster: try await ServiceCluster.start(options), clock: clock, tasksClock: tasksClock)
    }

    func stop() async { await cluster.stop() }

    /// Signs a user up in accounts.
    func user(_ prefix: String = "u", displayName: String? = nil) async throws -> User {
        let name = uniqueName(prefix)
        return try await cluster.signUp(name, displayName: displayName ?? name.capitalized, email: "\(name)@example.com")
    }

    /// The mails accounts' sink holds for `email` (household invites).
    func mails(to email: String) async throws -> [Accounts_V1_Mail] {
        var r = Accounts_V1_ListSentMailRequest()
        r.toEmail = email
        r.kind = .householdInvite
        r.pageSize = 100
        return try await accountsInternal.listSentMail(r).mails
    }

    func waitForMail(to email: String, count: Int = 1) async throws -> [Accounts_V1_Mail] {
        var mails: [Accounts_V1_Mail] = []
        _ = try await eventually {
            mails = try await self.mails(to: email); return mails.count >= count
        }
        return mails
    }

    /// Sends a notification as another service would.
    @discardableResult
    func notify(
        _ recipients: [String], kind: Social_V1_NotificationKind = .taskReminder, title: String = "Take out the recycling",
        actor: String = "", event: String = "tasks:\(ULID.make())"
    ) async throws -> Social_V1_SendNotificationResponse {
        var r = Social_V1_SendNotificationRequest()
        r.eventId = event
        r.recipientUserIds = recipients
        r.kind = kind
        r.title = title
        r.actorUserId = actor
        return try await internalAPI.sendNotification(r)
    }

    /// A chore `by` creates in tasks for `household`, assigned to `assignee` alone, due `due`
    /// (tasks' clock must not be past it). Returns its id.
    func chore(_ name: String, in household: String, for assignee: User, due: (Int32, Int32, Int32), by: User) async throws -> String {
        var d = Common_V1_Date()
        (d.year, d.month, d.day) = due
        var r = Tasks_V1_CreateChoreRequest()
        r.idempotencyKey = UUID().uuidString
        r.householdId = household
        r.name = name
        r.dueDate = d
        r.assigneeUserIds = [assignee.id]
        var weekly = Tasks_V1_ChoreRecurrence()
        weekly.kind = .weekly(Tasks_V1_ChoreWeekly())
        r.recurrence = weekly
        r.timeZone = "UTC"
        return try await tasks.createChore(r, options: by.options).chore.choreId
    }
}

/// Runs `body` against a fresh environment and always stops it.
func withSocial(
    tasksUp: Bool = true, accountsDown: Bool = false, _ configure: @escaping @Sendable (inout SocialConfiguration) -> Void = { _ in },
    _ body: (SocialEnv) async throws -> Void
) async throws {
    let env = try await SocialEnv.start(tasksUp: tasksUp, accountsDown: accountsDown, configure)
    do { try await body(env) } catch {
        await env.stop()
        throw error
    }
    await env.stop()
}

/// A live notification stream read in the background: every element is collected.
final class LiveStream: Sendable {
    let elements = Mutex<[Social_V1_SubscribeNotificationsResponse]>([])
    let ended = Mutex<RPCError?>(nil)
    let finished = Mutex(false)
    private let task = Mutex<Task<Void, Never>?>(nil)

    /// Opens the stream and waits for `started`.
    static func open(_ client: Social_V1_SocialClient, _ user: User, after: String = "", timeout: Duration = .seconds(60)) async throws -> LiveStream
    {
        let s = LiveStream()
        var request = Social_V1_SubscribeNotificationsRequest()
        request.afterNotificationId = after
        let t = Task {
            do {
                try await client.subscribeNotifications(request, options: bearer(user.token, timeout: timeout)) { stream in
                    for try await e in stream.messages { s.elements.withLock { $0.append(e) } }
                }
            } catch let e as RPCError {
                s.ended.withLock { $0 = e }
            } catch {
                s.ended.withLock { $0 = RPCError(.unknown, "\(error)") }
            }
            s.finished.withLock { $0 = true }
        }
        s.task.withLock { $0 = t }
        let ok = await eventually(timeout: .seconds(20)) { s.hasStarted || s.isFinished }
        if !ok || !s.hasStarted { throw RPCError(.deadlineExceeded, "stream did not start: \(String(describing: s.ended.withLock { $0 }))") }
        return s
    }

    var hasStarted: Bool { elements.withLock { $0.first.map { if case .started = $0.event { true } else { false } } ?? false } }
    var isFinished: Bool { finished.withLock { $0 } }
    var started: Social_V1_SubscriptionStarted? {
        elements.withLock { if case .started(let s)? = $0.first?.event { s } else { nil } }
    }
    var notifications: [Social_V1_Notification] {
        elements.withLock { $0.compactMap { if case .notification(let n)? = $0.event { n } else { nil } } }
    }
    var ids: [String] { notifications.map(\.notificationId) }

    /// Waits until `count` notifications arrived.
    @discardableResult
    func waitFor(_ count: Int, timeout: Duration = .seconds(10)) async -> Bool {
        await eventually(timeout: timeout) { self.notifications.count >= count }
    }

    func cancel() async {
        let t = task.withLock { $0 }
        t?.cancel()
        await t?.value
    }

    func waitUntilFinished(timeout: Duration = .seconds(10)) async -> RPCError? {
        _ = await eventually(timeout: timeout) { self.isFinished }
        return ended.withLock { $0 }
    }
}

/// A value shared by concurrent test tasks.
final class Shared<T: Sendable>: Sendable {
    private let value: Mutex<T>
    init(_ v: T) { value = Mutex(v) }
    func withLock<R: Sendable>(_ body: (inout T) -> R) -> R { value.withLock { body(&$0) } }
}
