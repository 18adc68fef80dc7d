import Contracts
import Foundation
import Logging
import Push
import RPCCore
import ServiceKit
import Storage
import Synchronization

/// The state both social services share: the database (through the kit's `ServiceStore`), the
/// clock, page tokens, the invite-guess throttles, the peers (accounts for names, tasks for
/// chores) and the live notification hub. `SocialService` and `SocialInternalService` route each
/// RPC here.
public final class SocialCore: Sendable {
    public let configuration: SocialConfiguration
    public let database: Database
    let store: ServiceStore
    let clock: any WallClock
    let logger: Logger
    let pageTokens: PageTokens
    let peers: PeerClients
    public let hub: NotificationHub
    let directory: UserDirectory
    let guessesByUser: SlidingWindowThrottle
    let guessesByAddress: SlidingWindowThrottle
    /// The configured push providers (none: nothing is pushed) and their delivery loops.
    let pushProviders: PushProviders
    let pushDelivery: PushDelivery?
    let pushPlan: PushPlan?

    /// Which unique constraint protects which request field (a race lost to a concurrent request).
    static let uniqueFields: [String: ServiceStore.UniqueField] = [
        "team_members.user_id": .init(field: "member_usernames", message: "already in a team"),
        "friendships.user_id": .init(field: "user", message: "already friends"),
        "blocks.blocker_id": .init(field: "user", message: "already blocked"),
        "follow_requests.requester_id": .init(field: "user", message: "a request is already pending"),
        "follows.follower_id": .init(field: "user", message: "already following"),
        "household_members.household_id": .init(field: "invite_code", message: "already a member"),
        // Not reachable while writes are serial (RegisterPushTarget deletes the other user's row
        // first), declared so that a change there answers with the field.
        "push_targets.token_key": .init(field: "target", message: "this token is already registered"),
    ]

    /// Opens (and migrates) the database. Blocking: call at startup.
    public init(
        configuration: SocialConfiguration, peers: PeerClients, clock: any WallClock = SystemClock(),
        logger: Logger = Logger(label: "social"), pushProviders: PushProviders? = nil
    ) throws {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        self.peers = peers
        let opened = try ServiceStore.open(
            directory: configuration.dataDirectory, schema: SocialSchema.schema,
            uniqueFields: Self.uniqueFields, logger: logger)
        (database, store, pageTokens) = (opened.database, opened.store, opened.pageTokens)
        let hub = NotificationHub(
            maxPerUser: configuration.maxSubscriptionsPerUser,
            maxQueued: configuration.maxQueuedPerSubscription, clock: clock)
        self.hub = hub
        directory = UserDirectory(store: store, peers: peers, deadline: configuration.peerDeadline, clock: clock, logger: logger)
        guessesByUser = SlidingWindowThrottle(
            name: "invite_code_guesses_per_user", limit: configuration.maxGuessesPerUser, window: configuration.guessWindow, clock: clock)
        guessesByAddress = SlidingWindowThrottle(
            name: "invite_code_guesses_per_address", limit: configuration.maxGuessesPerAddress, window: configuration.guessWindow, clock: clock)
        let providers = try pushProviders ?? PushProviders(configuration.push)
        self.pushProviders = providers
        if providers.isEmpty {
            pushDelivery = nil
            pushPlan = nil
        } else {
            pushDelivery = PushDelivery(
                providers: providers, store: opened.store, clock: clock, logger: logger, concurrency: configuration.pushConcurrency,
                retry: configuration.pushRetry)
            var streaming: (@Sendable (String) -> Bool)?
            if !configuration.pushWhileStreaming {
                streaming = { user in hub.liveCount(userID: user) > 0 }
            }
            pushPlan = PushPlan(providers: providers.all.keys.map { $0.rawValue }.sorted(), isStreaming: streaming)
        }
    }

    /// The public service.
    public var service: SocialService { SocialService(core: self) }
    /// The service-to-service API.
    public var internalService: SocialInternalService { SocialInternalService(core: self) }
    /// Both, for a server's service list.
    public var services: [any RPCService] { [service, internalService] }

    /// Loops the process runs next to the server: stream upkeep (expired tokens) and table upkeep.
    /// (The outbox is delivered by the host: `ServiceHost.run(outbox:)`.)
    public var backgroundJobs: [@Sendable () async -> Void] {
        var jobs: [@Sendable () async -> Void] = [{ await self.streamUpkeep() }, { await self.sessionChecks() }, { await self.maintenance() }]
        // A job that returns ends the process (ServiceGroup): the push loops only when there are providers.
        if pushDelivery != nil { jobs.append { await self.push() } }
        return jobs
    }

    /// Sends the push outbox until cancelled, then closes the providers' connections (one of
    /// `backgroundJobs`; the test cluster runs it alone).
    public func push() async {
        if let pushDelivery { await pushDelivery.run() }
        await pushProviders.shutdown()
    }

    /// Makes the push loops look at the outbox now (tests, after moving a manual clock).
    public func wakePush() { pushDelivery?.wake() }

    /// Ends every live stream (UNAVAILABLE) before the server drains: clients reconnect with
    /// after_notification_id and miss nothing.
    public func shutDownStreams() { hub.shutDown() }

    /// Closes the database (after the server stopped).
    public func close() { database.close() }

    // MARK: Helpers for the handlers

    func now() -> Int64 { clock.nowMilliseconds() }

    /// The verified caller of an authenticated RPC.
    func caller(_ context: ServerContext) throws -> CallerIdentity { try context.requireIdentity() }

    /// A write that stores notifications to push: `body` adds them to its `Outbound`; after the
    /// commit they reach the live streams in commit order (never when the commit fails).
    func writePublishing<T: Sendable>(_ body: @escaping @Sendable (Transaction, inout Outbound) throws -> T) async throws -> T {
        let plan = pushPlan
        let (r, pushed) = try await store.write(publishing: hub.publication) { tx, items in
            var out = Outbound(push: plan)
            let r = try body(tx, &out)
            items = out.live
            return (r, out.pushQueued)
        }
        if pushed { pushDelivery?.wake() }
        return r
    }

    /// `ServiceStore.receiveOnce` for an event whose effect stores notifications (pushed after the
    /// commit, in commit order). True when the event was seen before.
    func receiveOncePublishing(eventID: String, _ effect: @escaping @Sendable (Transaction, inout Outbound) throws -> Void) async throws -> Bool {
        let plan = pushPlan
        let pushed = Mutex(false)
        let seen = try await store.receiveOnce(eventID: eventID, publishing: hub.publication) { tx, items in
            var out = Outbound(push: plan)
            try effect(tx, &out)
            items = out.live
            pushed.withLock { $0 = out.pushQueued }
        }
        if pushed.withLock({ $0 }) { pushDelivery?.wake() }
        return seen
    }

    // MARK: Upkeep

    /// Every second: streams whose access token expired are closed.
    func streamUpkeep() async {
        while !Task.isCancelled {
            hub.closeExpired()
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// Every `sessionCheckInterval`: asks accounts which sessions of the live streams ended
    /// (`AccountsInternal.CheckSessions`, 500 per call, the peer deadline) and ends their streams
    /// with UNAUTHENTICATED. While accounts cannot answer, streams stay open (they still end when
    /// their access token expires) and the next round asks again.
    func sessionChecks() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.sessionCheckInterval)
            if Task.isCancelled { return }
            await checkSessionsOnce()
        }
    }

    /// One round of `sessionChecks` (tests call it directly).
    public func checkSessionsOnce() async {
        let sessions = hub.liveSessionIDs
        guard !sessions.isEmpty else { return }
        let accounts = Accounts_V1_AccountsInternalClient(peers.client("accounts"))
        var start = 0
        while start < sessions.count {
            var r = Accounts_V1_CheckSessionsRequest()
            r.sessionIds = Array(sessions[start..<min(start + 500, sessions.count)])
            start += 500
            do {
                let ended = try await accounts.checkSessions(r, options: CallOptions(timeout: configuration.peerDeadline))
                let closed = hub.closeSessions(Set(ended.endedSessionIds))
                if closed > 0 { logger.info("closed streams of ended sessions", metadata: ["streams": "\(closed)"]) }
            } catch {
                logger.warning("accounts did not answer CheckSessions; streams stay open", metadata: ["error": "\(error)"])
                return
            }
        }
    }

    /// Hourly: expired invites older than a month, stale pushes, the kit's tables.
    func maintenance() async {
        while !Task.isCancelled {
            do {
                let now = self.now()
                let month: Int64 = 31 * 24 * 3600 * 1000
                try await store.write { tx in
                    try tx.execute("DELETE FROM household_invites WHERE expires_at < ? AND used_at IS NULL", now - month)
                    // Pushes past their lifetime (their provider no longer configured, say) never go.
                    try tx.execute("DELETE FROM push_outbox WHERE expires_at < ?", now)
                }
                try await store.purgeKitTables(now: now)
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(3600))
        }
    }
}

/// Notifications a write stored that go to live streams after its commit.
struct Outbound: Sendable {
    var live: [NotificationHub.Delivery] = []
    /// How to queue pushes; nil when no push provider is configured.
    var push: PushPlan?
    /// Rows went into the push outbox: the delivery loops are woken after the commit.
    var pushQueued = false
}

extension RPCError {
    /// A peer that did not answer in time.
    static func peerUnavailable(_ peer: String) -> RPCError {
        RPCError.retryLater("\(peer) is unavailable right now: try again shortly", after: .seconds(1), code: .unavailable)
    }
}
