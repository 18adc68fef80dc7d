import Accounts
import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Synchronization
import Testing

// Real components over real gRPC on loopback: the real accounts (AccountsCore, in this process,
// cheap scrypt) as social's peer and token issuer, social on the kit's TestServer, social's outbox
// delivered to its peers as the host does it. tasks does not exist yet: `TasksPeer` is a minimal
// TasksInternal on loopback that answers ListTasksAssignedToUser from a table and records
// EndHouseholdChores, so the calls social makes can be checked.

/// A tasks stand-in on loopback (TasksInternal only).
final class TasksPeer: Tasks_V1_TasksInternalService, Sendable {
    let chores = Mutex<[String: [Tasks_V1_Chore]]>([:])  // user id → chores
    let ended = Mutex<[Tasks_V1_EndHouseholdChoresRequest]>([])

    func listTasksAssignedToUser(
        request: Tasks_V1_ListTasksAssignedToUserRequest, context: ServerContext
    ) async throws -> Tasks_V1_ListTasksAssignedToUserResponse {
        var r = Tasks_V1_ListTasksAssignedToUserResponse()
        r.chores = chores.withLock { $0[request.userId] ?? [] }.filter { $0.householdId == request.householdId }
        return r
    }
    func endHouseholdChores(request: Tasks_V1_EndHouseholdChoresRequest, context: ServerContext) async throws -> Tasks_V1_EndHouseholdChoresResponse {
        let replay = ended.withLock { list in
            if list.contains(where: { $0.eventId == request.eventId }) { return true }
            list.append(request)
            return false
        }
        var r = Tasks_V1_EndHouseholdChoresResponse()
        r.replayed = replay
        return r
    }
    func eraseUser(request: Tasks_V1_EraseUserRequest, context: ServerContext) async throws -> Tasks_V1_EraseUserResponse {
        Tasks_V1_EraseUserResponse()
    }
    func verifyJournal(request: Tasks_V1_VerifyJournalRequest, context: ServerContext) async throws -> Tasks_V1_VerifyJournalResponse {
        throw RPCError(.unimplemented, "not in the stand-in")
    }
}

/// A port nothing listens on (a peer that is down).
func closedPort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    close(fd)
    return Int(UInt16(bigEndian: addr.sin_port))
}

/// A signed-up user: id, username, email, access token.
struct User: Sendable {
    var id: String
    var username: String
    var email: String
    var displayName: String
    var token: String
    var options: CallOptions { bearer(token) }
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

/// accounts + social (+ the tasks stand-in) on loopback, fresh data directories, a manual clock
/// for social (tests move time: invite expiry, snoozes, token expiry).
final class SocialEnv: Sendable {
    let directory: TemporaryDirectory
    let accountsCore: AccountsCore
    let accountsServer: TestServer
    let tasks: TasksPeer
    let tasksServer: TestServer?
    let core: SocialCore
    let server: TestServer
    let clock: ManualClock
    let jobs: Task<Void, Never>

    var social: Social_V1_SocialClient { Social_V1_SocialClient(server.gateway) }
    var internalAPI: Social_V1_SocialInternalClient { Social_V1_SocialInternalClient(server.service) }
    var accounts: Accounts_V1_AccountsClient { Accounts_V1_AccountsClient(accountsServer.anonymous) }
    var accountsInternal: Accounts_V1_AccountsInternalClient { Accounts_V1_AccountsInternalClient(accountsServer.service) }

    private init(
        directory: TemporaryDirectory, accountsCore: AccountsCore, accountsServer: TestServer, tasks: TasksPeer,
        tasksServer: TestServer?, core: SocialCore, server: TestServer, clock: ManualClock, jobs: Task<Void, Never>
    ) {
        self.directory = directory
        self.accountsCore = accountsCore
        self.accountsServer = accountsServer
        self.tasks = tasks
        self.tasksServer = tasksServer
        self.core = core
        self.server = server
        self.clock = clock
        self.jobs = jobs
    }

    /// - Parameters: tasksUp: whether the tasks stand-in listens (else tasks is down);
    ///   accountsDown: social's accounts peer points at a closed port (accounts still issues tokens).
    static func start(
        tasksUp: Bool = true, accountsDown: Bool = false,
        _ configure: (inout SocialConfiguration) -> Void = { _ in }
    ) async throws -> SocialEnv {
        let directory = TemporaryDirectory("social-tests")
        var accountsConfiguration = AccountsConfiguration(dataDirectory: directory.path + "/accounts")
        accountsConfiguration.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        accountsConfiguration.maxSignUpsPerAddress = 100_000
        // SOCIAL_TEST_LOG=1 shows the services' logs (stderr) when a test needs explaining.
        let quiet =
            ProcessInfo.processInfo.environment["SOCIAL_TEST_LOG"] == "1"
            ? Logger(label: "social-test") { StreamLogHandler.standardError(label: $0) }
            : Logger(label: "social-test") { _ in SwiftLogNoOpLogHandler() }
        let accountsCore = try AccountsCore(configuration: accountsConfiguration, logger: quiet)
        let accountsServer = try await TestServer(services: accountsCore.services, keys: accountsCore.signingKeySource, logger: quiet)
        let tasks = TasksPeer()
        let tasksServer = tasksUp ? try await TestServer(services: [tasks], keys: accountsCore.signingKeySource, logger: quiet) : nil
        let ports = ["accounts": accountsDown ? closedPort() : accountsServer.port, "tasks": tasksServer?.port ?? closedPort()]
        let peers = PeerClients { peer in TestServer.peerClient(port: ports[peer] ?? closedPort()) }
        var configuration = SocialConfiguration(dataDirectory: directory.path + "/social")
        configuration.peerDeadline = .seconds(2)
        configure(&configuration)
        let clock = ManualClock()
        let core = try SocialCore(configuration: configuration, peers: peers, clock: clock, logger: quiet)
        let server = try await TestServer(services: core.services, keys: accountsCore.signingKeySource, logger: quiet)
        let delivery = OutboxDelivery(
            database: core.database, retry: OutboxRetryPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(200)),
            pollInterval: .milliseconds(200), logger: quiet, deliver: OutboxSenders.rpc(peers: peers).deliver)
        let jobs = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await delivery.run() }
                group.addTask { await accountsCore.runResetMails() }
            }
        }
        return SocialEnv(
            directory: directory, accountsCore: accountsCore, accountsServer: accountsServer, tasks: tasks,
            tasksServer: tasksServer, core: core, server: server, clock: clock, jobs: jobs)
    }

    func stop() async {
        core.shutDownStreams()
        jobs.cancel()
        await server.stop()
        await tasksServer?.stop()
        await accountsServer.stop()
        _ = await jobs.value
        core.close()
        accountsCore.close()
        directory.remove()
    }

    /// Signs a user up in accounts.
    func user(_ prefix: String = "u", displayName: String? = nil) async throws -> User {
        let name = uniqueName(prefix)
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = "\(name)@example.com"
        r.password = "correct horse battery staple"
        r.displayName = displayName ?? name.capitalized
        let s = try await accounts.signUp(r)
        return User(id: s.user.userId, username: name, email: r.email, displayName: r.displayName, token: s.session.accessToken)
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
}

/// Runs `body` against a fresh environment and always stops it.
func withSocial(
    tasksUp: Bool = true, accountsDown: Bool = false, _ configure: (inout SocialConfiguration) -> Void = { _ in },
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

/// A file next to the test binary (the executables SwiftPM built with the tests).
func builtProduct(_ name: String) -> String {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
    while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
    return dir.appendingPathComponent(name).path
}

/// A value shared by concurrent test tasks.
final class Shared<T: Sendable>: Sendable {
    private let value: Mutex<T>
    init(_ v: T) { value = Mutex(v) }
    func withLock<R: Sendable>(_ body: (inout T) -> R) -> R { value.withLock { body(&$0) } }
}
