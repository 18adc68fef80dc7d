import Contracts
import Foundation
import Logging
import RPCCore
import ServiceKit
import Storage

/// The state both matchmaking services share: the database (through the kit's `ServiceStore`),
/// the clock, page tokens, peers (accounts for names, social for relationships), the live match
/// streams, the queue and the leaderboard index. `MatchmakingService` and
/// `MatchmakingInternalService` route each RPC here.
public final class MatchmakingCore: Sendable {
    public let configuration: MatchmakingConfiguration
    public let database: Database
    let store: ServiceStore
    let clock: any WallClock
    let logger: Logger
    let pageTokens: PageTokens
    let peers: PeerClients
    let hub: MatchHub
    let queue: MatchQueue
    let ranks: RankIndex
    let directory: UserDirectory
    let relations: Relations
    let chatThrottle: SlidingWindowThrottle
    /// Relationship questions the queue is waiting for (asked once at a time per pair).
    private let asking = InFlightKeys()

    static let uniqueFields: [String: ServiceStore.UniqueField] = [
        "challenges.pair_low": .init(field: "opponent", message: "a pending challenge between you already exists"),
        "challenges_pending_pair": .init(field: "opponent", message: "a pending challenge between you already exists"),
    ]

    /// Opens (and migrates) the database and loads the leaderboard. Blocking: call at startup.
    public init(
        configuration: MatchmakingConfiguration, peers: PeerClients, clock: any WallClock = SystemClock(),
        logger: Logger = Logger(label: "matchmaking")
    ) throws {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        self.peers = peers
        let opened = try ServiceStore.open(
            directory: configuration.dataDirectory, schema: MatchmakingSchema.schema,
            uniqueFields: Self.uniqueFields, logger: logger)
        (database, store, pageTokens) = (opened.database, opened.store, opened.pageTokens)
        hub = MatchHub(maxPerUser: configuration.maxWatchStreamsPerUser, maxQueued: configuration.maxQueuedEvents)
        queue = MatchQueue(lifetime: configuration.queueLifetime, statusEvery: configuration.queueStatusEvery)
        ranks = RankIndex()
        directory = UserDirectory(store: store, peers: peers, deadline: configuration.peerDeadline, clock: clock, logger: logger)
        relations = Relations(
            peers: peers, deadline: configuration.peerDeadline, cacheFor: configuration.relationshipCacheFor, clock: clock, logger: logger)
        chatThrottle = SlidingWindowThrottle(
            name: "chat_messages_per_player_and_match", limit: configuration.chatLimit, window: configuration.chatWindow, clock: clock)
        do { try loadRanks() } catch {
            database.close()
            throw error
        }
    }

    /// The public service.
    public var service: MatchmakingService { MatchmakingService(core: self) }
    /// The service-to-service API.
    public var internalService: MatchmakingInternalService { MatchmakingInternalService(core: self) }
    /// Both, for a server's service list.
    public var services: [any RPCService] { [service, internalService] }

    /// Loops next to the server: the matchmaker and deadlines (every tick), table upkeep (hourly).
    public var backgroundJobs: [@Sendable () async -> Void] {
        [{ await self.upkeepLoop() }, { await self.maintenance() }]
    }

    /// Ends every live stream (UNAVAILABLE for watchers, who resume with after_sequence; queue
    /// streams end) before the server drains.
    public func shutDownStreams() {
        hub.shutDown()
        queue.shutDown()
    }

    /// Closes the database (after the server stopped).
    public func close() { database.close() }

    func now() -> Int64 { clock.nowMilliseconds() }

    func caller(_ context: ServerContext) throws -> CallerIdentity { try context.requireIdentity() }

    /// A write whose live side (events to watchers, leaderboard updates) is applied after its commit.
    func write<T: Sendable>(_ body: @escaping @Sendable (Transaction, inout Effects) throws -> T) async throws -> T {
        let (result, effects) = try await store.write { tx -> (T, Effects) in
            var effects = Effects()
            let r = try body(tx, &effects)
            return (r, effects)
        }
        apply(effects)
        return result
    }

    func apply(_ effects: Effects) {
        hub.publish(effects.events)
        for r in effects.ratings { ranks.update(userID: r.userID, key: r.key, version: r.version) }
    }

    private func loadRanks() throws {
        let entries = try database.readSync { c in
            try c.query("SELECT user_id, rating, deviation, volatility, rated_matches, updated_at, version FROM ratings").compactMap {
                row -> (key: RankIndex.Key, version: Int64)? in
                let user: String = try row.get("user_id")
                let rec = RatingRecord(
                    rating: Glicko2.Rating(rating: try row.get("rating"), deviation: try row.get("deviation"), volatility: try row.get("volatility")),
                    ratedMatches: try row.get("rated_matches"), updatedAt: try row.get("updated_at"), version: try row.get("version"))
                guard let key = rec.key(userID: user) else { return nil }
                return (key, rec.version)
            }
        }
        ranks.load(entries)
    }

    // MARK: Upkeep

    /// Every tick: the queue's statuses, expiries and a pairing pass; turn deadlines, rematch
    /// windows and challenge expiries that fell due.
    func upkeepLoop() async {
        while !Task.isCancelled {
            await upkeepOnce()
            try? await Task.sleep(for: configuration.tick)
        }
    }

    func upkeepOnce() async {
        let now = self.now()
        queue.upkeep(now: now)
        await pairingPass(now: now)
        do { try await sweepDeadlines(now: now) } catch { logger.error("deadline sweep failed", metadata: ["error": "\(error)"]) }
    }

    /// Ends matches whose turn deadline passed, closes rematch windows, expires challenges.
    func sweepDeadlines(now: Int64) async throws {
        let (late, windows, challenges) = try await store.read { c -> ([String], [String], Bool) in
            let late = try c.query("SELECT id FROM matches WHERE turn_deadline IS NOT NULL AND turn_deadline <= ? LIMIT 200", now)
                .map { try $0.get("id", as: String.self) }
            let windows = try c.query("SELECT id FROM matches WHERE window_closes_at IS NOT NULL AND window_closes_at <= ? LIMIT 200", now)
                .map { try $0.get("id", as: String.self) }
            let challenges = try c.queryOne("SELECT 1 FROM challenges WHERE status = 1 AND expires_at <= ? LIMIT 1", now) != nil
            return (late, windows, challenges)
        }
        guard !late.isEmpty || !windows.isEmpty || challenges else { return }
        let configuration = self.configuration
        try await write { tx, effects in
            for id in late {
                guard var m = try MatchRecord.load(tx, id) else { continue }
                try MatchStore.expireTurnIfDue(tx, &m, now: now, configuration: configuration, effects: &effects)
            }
            for id in windows {
                guard var m = try MatchRecord.load(tx, id) else { continue }
                try MatchStore.closeWindowIfDue(tx, &m, now: now, effects: &effects)
            }
            if challenges { try tx.execute("UPDATE challenges SET status = 5 WHERE status = 1 AND expires_at <= ?", now) }
        }
    }

    /// One pass of the matchmaker: pairs made become matches; pairs whose relationship is not
    /// known yet are asked of social (answered by a later pass).
    func pairingPass(now: Int64) async {
        guard queue.count >= 2 else { return }
        let relations = self.relations
        let (pairs, unknown) = queue.pass(now: now, neighbors: configuration.pairingNeighbors) { a, b in
            relations.cached(a, b).map { $0.blocked }
        }
        for (a, b) in unknown { askRelationship(a, b) }
        for (first, second) in pairs {
            do {
                try await startRandomMatch(first, second, now: now)
            } catch {
                await pairingFailed([first, second], error)
            }
        }
    }

    /// A queue pair whose match was not made. A player who left meanwhile (stream closed, CancelQueue)
    /// is gone; a player who started a match (a challenge) while queued, or whose account was
    /// erased, leaves the queue (its stream hears CANCELLED); the other waits on with their time kept.
    private func pairingFailed(_ pair: [MatchQueue.Ticket], _ error: any Error) async {
        let out =
            (try? await store.read { c in
                try pair.filter { t in try MatchStore.activeNonLocalMatch(c, t.userID) != nil || MatchStore.isErased(c, t.userID) }
                    .map(\.userID)
            }) ?? []
        if out.isEmpty && pair.allSatisfy(\.stream.isOpen) {
            logger.warning("could not start a random match", metadata: ["error": "\(error)"])
        }
        for t in pair where out.contains(t.userID) {
            t.stream.deliver(.cancelled)
            t.stream.finish()
        }
        queue.putBack(pair)
    }

    private func askRelationship(_ a: String, _ b: String) {
        let key = Relations.key(a, b)
        guard asking.claim(key) else { return }
        let relations = self.relations, asking = self.asking
        Task {
            _ = try? await relations.fresh(a, b)
            asking.release(key)
        }
    }

    /// A player of a queue pair left (stream closed or cancelled) before its match was written.
    struct PlayerLeft: Error {}

    /// Makes the match of a queue pair (the earlier joiner is FIRST) and tells both streams. The
    /// transaction claims both streams first: a player who left by then gets no match (`PlayerLeft`).
    func startRandomMatch(_ first: MatchQueue.Ticket, _ second: MatchQueue.Ticket, now: Int64) async throws {
        guard first.stream.isOpen, second.stream.isOpen else { throw PlayerLeft() }
        let refs = [await directory.bestEffort(id: first.userID), await directory.bestEffort(id: second.userID)]
        let id = ULID.make(now: now)
        let configuration = self.configuration
        let match: MatchRecord
        do {
            match = try await write { tx, effects -> MatchRecord in
                for t in [first, second] where try MatchStore.activeNonLocalMatch(tx, t.userID) != nil {
                    throw RPCError(.failedPrecondition, "a player is already in an active match")
                }
                guard first.stream.claim(), second.stream.claim() else { throw PlayerLeft() }
                let m = try MatchStore.create(
                    tx, id: id, kind: .random, rated: true, players: [first.userID, second.userID], caller: "", columns: GameState.defaultSize,
                    rows: GameState.defaultSize, rematchOf: "", now: now, configuration: configuration, effects: &effects)
                for (seat, t) in [(GameSeat.first, first), (GameSeat.second, second)] {
                    try Notify.send(
                        tx, eventID: "matchmaking:match-found:\(id):\(seat.rawValue)", to: [t.userID], kind: .matchFound,
                        title: "Opponent found: \(Names.name(refs[seat.other.index]))", actor: refs[seat.other.index].userId, matchID: id)
                }
                return m
            }
        } catch {
            first.stream.unclaim()
            second.stream.unclaim()
            throw error
        }
        queue.paired([first, second])
        first.stream.deliver(.matched(matchID: match.id, opponent: refs[1], seat: .first))
        second.stream.deliver(.matched(matchID: match.id, opponent: refs[0], seat: .second))
        first.stream.finish()
        second.stream.finish()
    }

    /// Hourly: finished matches' event logs past their keeping time, the kit's tables. The first
    /// pass of the process reads every finished match (through the `matches_finished` index); later
    /// ones only those finished since the previous cutoff, less a day (a match's log can still grow
    /// a little after its end: the rematch window's close), so each pass reads about an hour's
    /// matches.
    func maintenance() async {
        var purgedBefore = Int64.min
        while !Task.isCancelled {
            do {
                let now = self.now()
                let before = now - configuration.keepEventsFor.milliseconds
                let from = purgedBefore == .min ? .min : purgedBefore - MatchStore.day
                try await store.write { tx in try MatchStore.purgeEventLogs(tx, finishedFrom: from, before: before) }
                purgedBefore = max(purgedBefore, before)
                try await store.purgeKitTables(now: now)
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(3600))
        }
    }
}

/// Display names in notification titles.
enum Names {
    static func name(_ u: Common_V1_UserRef) -> String {
        !u.displayName.isEmpty ? u.displayName : !u.username.isEmpty ? u.username : "a player"
    }
}

/// Notifications to players go through social (`SocialInternal/SendNotification`), queued in
/// the outbox in the transaction of the change they announce.
enum Notify {
    static func send(
        _ tx: Transaction, eventID: String, to recipients: [String], kind: Social_V1_NotificationKind, title: String, body: String = "",
        actor: String, matchID: String = "", challengeID: String = "", data: [String: String] = [:]
    ) throws {
        let recipients = recipients.filter { !$0.isEmpty }
        guard !recipients.isEmpty else { return }
        var r = Social_V1_SendNotificationRequest()
        r.eventId = eventID
        r.recipientUserIds = recipients
        r.kind = kind
        // Social checks 1...100 and 0...500 Unicode scalars, not characters (an emoji can be
        // several scalars): a longer title would be refused and the notification lost.
        r.title = FieldRules.clip(title, to: 100)
        r.body = FieldRules.clip(body, to: 500)
        r.actorUserId = actor
        if !matchID.isEmpty {
            var t = Social_V1_NotificationTarget()
            t.matchId = matchID
            r.target = t
        } else if !challengeID.isEmpty {
            var t = Social_V1_NotificationTarget()
            t.challengeId = challengeID
            r.target = t
        }
        r.data = data
        try tx.enqueueCall(Social_V1_SocialInternalMethods.sendNotification, r, eventID: eventID)
    }
}
