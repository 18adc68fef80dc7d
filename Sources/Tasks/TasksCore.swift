import Contracts
import Foundation
import Logging
import RPCCore
import Security
import ServiceKit
import Storage
import Synchronization

/// The state every area of the tasks service shares: one database (each area's tables in its own
/// migrations), the clock, page tokens, the peers, the user-name directory, the journal. Each area
/// (team tasks, chores; the marketplace and habits next) is its own part — rules, store, handlers
/// — reached from the two thin services `TasksService` and `TasksInternalService`.
public final class TasksCore: Sendable {
    public let configuration: TasksConfiguration
    public let database: Database
    let store: ServiceStore
    let clock: any WallClock
    let logger: Logger
    let pageTokens: PageTokens
    let peers: TasksPeers
    let users: UserDirectory
    let badUploadTokens: SlidingWindowThrottle
    /// Raised by writes that moved a pending reminder: the scanner looks again (`runReminders`).
    let reminderSignal = ReminderSignal()

    /// Which unique index protects which request field (a race lost to a concurrent request).
    static let uniqueFields: [String: ServiceStore.UniqueField] = [
        "team_tasks.link_token": .init(field: "task_id", message: "the link was created by a concurrent request: ask again")
    ]

    /// Opens (migrating) the database. Blocking: call at startup.
    public init(
        configuration: TasksConfiguration, peers: PeerClients, clock: any WallClock = SystemClock(), logger: Logger = Logger(label: "tasks")
    )
        throws
    {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        let opened = try ServiceStore.open(
            directory: configuration.dataDirectory, schema: TasksSchema.schema,
            uniqueFields: Self.uniqueFields, logger: logger)
        (database, store, pageTokens) = (opened.database, opened.store, opened.pageTokens)
        self.peers = TasksPeers(peers: peers, deadline: configuration.peerDeadline)
        users = UserDirectory(store: store, peers: self.peers, refreshAfter: configuration.userRefreshAfter, clock: clock, logger: logger)
        badUploadTokens = SlidingWindowThrottle(
            name: "bad_upload_tokens_per_address", limit: configuration.maxBadUploadTokensPerAddress, window: .seconds(15 * 60))
        // Chores and habits stored before reminders existed get their pending reminders (once:
        // afterwards every one has its row).
        let now = clock.nowMilliseconds()
        let backfilled = try database.writeSync { tx in try ReminderStore.backfill(tx, now: now) }
        if backfilled > 0 { logger.notice("pending reminders created for existing chores and habits", metadata: ["count": "\(backfilled)"]) }
    }

    /// The public service.
    public var service: TasksService { TasksService(core: self) }
    /// The service-to-service API.
    public var internalService: TasksInternalService { TasksInternalService(core: self) }
    public var services: [any RPCService] { [service, internalService] }

    /// Loops the process runs beside the server (the outbox is delivered by the host).
    public var backgroundJobs: [@Sendable () async -> Void] { [{ await self.maintenance() }, { await self.runReminders() }] }

    public func close() { database.close() }

    // MARK: Helpers for the handlers

    var now: Int64 { clock.nowMilliseconds() }

    func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T { try await store.read(body) }
    func write<T: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> T) async throws -> T { try await store.write(body) }

    /// The verified caller's user id.
    func caller(_ context: ServerContext) throws -> String { try context.requireIdentity().userID }

    /// Queues a notification to `recipients` (social's SendNotification through the outbox, in
    /// this transaction). Nothing is queued for an empty list.
    func notify(
        _ tx: Transaction, kind: Social_V1_NotificationKind, recipients: [String], actor: String, title: String, body: String,
        target: Social_V1_NotificationTarget.OneOf_Target, data: [String: String] = [:], eventID: String
    ) throws {
        guard !recipients.isEmpty else { return }
        var r = Social_V1_SendNotificationRequest()
        r.eventId = eventID
        r.recipientUserIds = recipients
        r.kind = kind
        r.title = Self.clip(title, 100)
        r.body = Self.clip(body, 500)
        r.actorUserId = actor
        var t = Social_V1_NotificationTarget()
        t.target = target
        r.target = t
        r.data = data
        try tx.enqueueCall(Social_V1_SocialInternalMethods.sendNotification, r, eventID: eventID)
    }

    /// At most `n` characters (Unicode scalars), with an ellipsis when cut.
    static func clip(_ s: String, _ n: Int) -> String {
        let scalars = s.unicodeScalars
        guard scalars.count > n else { return s }
        var out = String.UnicodeScalarView(scalars.prefix(n - 1))
        out.append("…")
        return String(out)
    }

    // MARK: Upkeep

    /// Hourly: purge the kit's tables, expired upload tokens, orphaned attachment bytes.
    func maintenance() async {
        while !Task.isCancelled {
            do {
                let now = self.now, keep = configuration.expiredUploadTokensKeptFor.milliseconds
                try await write { tx in
                    try tx.execute("DELETE FROM team_task_upload_tokens WHERE expires_at < ?", now - keep)
                    try tx.execute("DELETE FROM attachment_blobs WHERE sha256 NOT IN (SELECT sha256 FROM team_task_attachments)")
                }
                try await store.purgeKitTables(now: now)
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            for _ in 0..<360 where !Task.isCancelled { try? await Task.sleep(for: .seconds(10)) }
        }
    }
}
