import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

/// An event of a match's log, handed to live watchers after its transaction committed.
struct MatchEvent: Sendable {
    var matchID: String
    var event: Matchmaking_V1_WatchMatchResponse
}

/// A rating row changed by a transaction: the leaderboard index takes it after the commit.
struct RatingUpdate: Sendable {
    var userID: String
    var key: RankIndex.Key?
    var version: Int64
}

/// What a write produced for the in-memory side (live streams, leaderboard), applied after commit.
struct Effects: Sendable {
    var events: [MatchEvent] = []
    var ratings: [RatingUpdate] = []
}

struct RatingRecord: Sendable {
    var rating = Glicko2.Rating()
    var ratedMatches = 0
    var updatedAt: Int64?
    var version: Int64 = 0

    var provisional: Bool { Glicko2.isProvisional(deviation: rating.deviation, ratedMatches: ratedMatches) }

    func key(userID: String) -> RankIndex.Key? {
        guard !provisional, let at = updatedAt else { return nil }
        return RankIndex.Key(rating: rating.rating, deviation: rating.deviation, reachedAt: at, userID: userID)
    }

    var proto: Matchmaking_V1_Rating {
        var r = Matchmaking_V1_Rating()
        r.rating = rating.rating
        r.deviation = rating.deviation
        r.volatility = rating.volatility
        r.ratedMatches = Int32(ratedMatches)
        r.provisional = provisional
        if let at = updatedAt { r.updatedAt = Google_Protobuf_Timestamp(milliseconds: at) }
        return r
    }

    static func load(_ db: some SQLReader, _ userID: String) throws -> RatingRecord {
        guard !userID.isEmpty,
            let row = try db.queryOne(
                "SELECT rating, deviation, volatility, rated_matches, updated_at, version FROM ratings WHERE user_id = ?", userID)
        else { return RatingRecord() }
        return RatingRecord(
            rating: Glicko2.Rating(rating: try row.get("rating"), deviation: try row.get("deviation"), volatility: try row.get("volatility")),
            ratedMatches: try row.get("rated_matches"), updatedAt: try row.get("updated_at"), version: try row.get("version"))
    }

    func save(_ tx: Transaction, userID: String) throws {
        try tx.execute(
            """
            INSERT INTO ratings (user_id, rating, deviation, volatility, rated_matches, updated_at, version) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(user_id) DO UPDATE SET rating = excluded.rating, deviation = excluded.deviation, volatility = excluded.volatility,
                rated_matches = excluded.rated_matches, updated_at = excluded.updated_at, version = excluded.version
            """,
            userID, rating.rating, rating.deviation, rating.volatility, ratedMatches, updatedAt ?? 0, version)
    }
}

enum MatchStore {
    static let day: Int64 = 24 * 3600 * 1000

    /// Appends an event to `m`'s log (next sequence) and to `effects`. `m` must be saved after.
    static func appendEvent(
        _ tx: Transaction, _ m: inout MatchRecord, now: Int64, effects: inout Effects,
        _ fill: (inout Matchmaking_V1_WatchMatchResponse) -> Void
    ) throws {
        m.lastSequence += 1
        var e = Matchmaking_V1_WatchMatchResponse()
        e.sequence = m.lastSequence
        e.occurredAt = Google_Protobuf_Timestamp(milliseconds: now)
        fill(&e)
        try tx.execute("INSERT INTO match_events (match_id, sequence, event) VALUES (?, ?, ?)", m.id, m.lastSequence, e.serializedBytes())
        effects.events.append(MatchEvent(matchID: m.id, event: e))
    }

    /// Whether `userID`'s account was erased (EraseUser): never in a new match, never rated again.
    static func isErased(_ db: some SQLReader, _ userID: String) throws -> Bool {
        try db.queryOne("SELECT 1 FROM erased_users WHERE id = ?", userID) != nil
    }

    /// The caller's account was erased while its access token is still valid.
    static let callerErased = RPCError(.unauthenticated, "the account of this access token no longer exists")

    /// Appends a RematchUpdate to `m`'s log: `state`, by `seat` when a player did it, the new
    /// match when STARTED. `m` must be saved after.
    static func appendRematch(
        _ tx: Transaction, _ m: inout MatchRecord, _ state: Matchmaking_V1_RematchState, by seat: GameSeat? = nil, newMatchID: String = "",
        now: Int64, effects: inout Effects
    ) throws {
        try appendEvent(tx, &m, now: now, effects: &effects) { e in
            var u = Matchmaking_V1_RematchUpdate()
            u.state = state
            if let seat { u.bySeat = seat.proto }
            u.newMatchId = newMatchID
            e.rematch = u
        }
    }

    /// Creates and stores a new match (ratings before from the ratings table; local matches 0).
    /// A player whose account was erased (a still-valid access token, a queue ticket taken at the
    /// moment of erasure) gets no match: UNAUTHENTICATED when it is `caller` (empty: the queue),
    /// FAILED_PRECONDITION for the other player.
    static func create(
        _ tx: Transaction, id: String, kind: Matchmaking_V1_MatchKind, rated: Bool, players: [String], caller: String, columns: Int,
        rows: Int, rematchOf: String, now: Int64, configuration: MatchmakingConfiguration, effects: inout Effects
    ) throws -> MatchRecord {
        for p in Set(players) where try isErased(tx, p) {
            throw p == caller ? callerErased : RPCError(.failedPrecondition, "the other player's account was deleted")
        }
        let local = kind == .local || players[0] == players[1]
        let before = local ? [0.0, 0.0] : try players.map { try RatingRecord.load(tx, $0).rating.rating }
        let seed = UInt64.random(in: 0...UInt64.max)
        let m = MatchRecord(
            id: id, kind: kind, rated: rated && !local, players: players, ratingBefore: before, seed: seed, columns: columns, rows: rows,
            now: now, deadline: local ? nil : now + configuration.turnTimeout.milliseconds, rematchOf: rematchOf)
        try m.insert(tx)
        return m
    }

    /// The match as the contract shows it, names from the cache, presence from the hub.
    static func proto(_ db: some SQLReader, _ m: MatchRecord, hub: MatchHub) throws -> Match {
        proto(m, users: try UserNames.refs(db, ids: m.players), hub: hub)
    }

    /// The same with the players' names already read (`users` holds them: a handler that read
    /// them for its own use, or a page's names read at once).
    static func proto(_ m: MatchRecord, users: [String: Common_V1_UserRef], hub: MatchHub) -> Match {
        m.proto(users: users, connected: hub.connected(m.id))
    }

    /// The id of an ACTIVE non-local match `userID` plays, if any.
    static func activeNonLocalMatch(_ db: some SQLReader, _ userID: String) throws -> String? {
        for column in ["first_id", "second_id"] {
            if let row = try db.queryOne(
                "SELECT id FROM matches WHERE \(column) = ? AND status = 1 AND kind != 1 LIMIT 1", userID)
            {
                return try row.get("id")
            }
        }
        return nil
    }

    /// Stores a played move and returns it as the contract shows it (without the player).
    static func recordMove(_ tx: Transaction, _ m: MatchRecord, _ v: ValidatedMove, now: Int64) throws -> Matchmaking_V1_Move {
        var move = Matchmaking_V1_Move()
        move.turnNumber = Int32(v.turn)
        move.seat = v.seat.proto
        if let p = v.placement { move.placement = MatchRecord.placement(p) }
        move.steps = v.steps.map { Matchmaking_V1_Direction(rawValue: Int32($0.rawValue)) }
        move.path = v.path.map(MatchRecord.cell)
        move.playedAt = Google_Protobuf_Timestamp(milliseconds: now)
        move.thinkTime = Google_Protobuf_Duration(milliseconds: max(0, now - m.turnStartedAt))
        try tx.execute("INSERT INTO match_moves (match_id, turn_number, move) VALUES (?, ?, ?)", m.id, v.turn, move.serializedBytes())
        return move
    }

    /// The moves of a match in turn order, with their players.
    static func moves(
        _ db: some SQLReader, _ m: MatchRecord, users: [String: Common_V1_UserRef], after: Int = 0, limit: Int = 1000
    ) throws
        -> [Matchmaking_V1_Move]
    {
        try db.query(
            "SELECT move FROM match_moves WHERE match_id = ? AND turn_number > ? ORDER BY turn_number LIMIT ?", m.id, after, limit
        ).map { row in
            var move = try Matchmaking_V1_Move(serializedBytes: try row.get("move", as: [UInt8].self))
            move.player = MatchRecord.ref(m.players[move.seat == .second ? 1 : 0], users)
            return move
        }
    }

    /// Ends `m` now: outcome, ratings (rated matches not ended by a deleted account), statistics
    /// (non-local matches), the rematch window, and the MatchOver event. `m` must be saved after.
    static func finish(
        _ tx: Transaction, _ m: inout MatchRecord, winner: GameSeat?, reason: Matchmaking_V1_MatchEndReason, forfeit: GameSeat?,
        now: Int64, configuration: MatchmakingConfiguration, effects: inout Effects
    ) throws {
        m.status = .finished
        m.finishedAt = now
        m.turnDeadline = nil
        var outcome = Matchmaking_V1_MatchOutcome()
        outcome.winner = winner?.proto ?? .unspecified
        outcome.reason = reason
        outcome.loserByForfeit = forfeit?.proto ?? .unspecified

        // An erased player (emptied id, or a match that somehow outlived the erasure) is never
        // rated nor counted again.
        let erased = try m.players.map { try $0.isEmpty || isErased(tx, $0) }
        if m.rated && !m.isLocal && reason != .accountDeleted && !erased.contains(true) {
            let before = try m.players.map { try RatingRecord.load(tx, $0) }
            for seat in GameSeat.allCases {
                let me = before[seat.index], them = before[seat.other.index]
                let score: Double = winner == nil ? 0.5 : winner == seat ? 1 : 0
                let idleDays = me.updatedAt.map { Int(max(0, now - $0) / day) } ?? 0
                let start = Glicko2.idle(me.rating, periods: idleDays)
                var after = me
                after.rating = Glicko2.update(start, results: [Glicko2.Result(opponent: them.rating, score: score)])
                after.ratedMatches += 1
                after.updatedAt = now
                after.version += 1
                try after.save(tx, userID: m.players[seat.index])
                effects.ratings.append(
                    RatingUpdate(userID: m.players[seat.index], key: after.key(userID: m.players[seat.index]), version: after.version))
                var change = Matchmaking_V1_RatingChange()
                change.seat = seat.proto
                change.ratingBefore = me.rating.rating
                change.ratingAfter = after.rating.rating
                change.deviationAfter = after.rating.deviation
                outcome.ratingChanges.append(change)
            }
        }
        m.outcome = outcome

        if !m.isLocal {
            // Turns and steps per seat, from the stored moves.
            var turns = [0, 0], steps = [0, 0]
            for row in try tx.query("SELECT move FROM match_moves WHERE match_id = ?", m.id) {
                let move = try Matchmaking_V1_Move(serializedBytes: try row.get("move", as: [UInt8].self))
                let i = move.seat == .second ? 1 : 0
                turns[i] += 1
                steps[i] += move.steps.count
            }
            for seat in GameSeat.allCases where !erased[seat.index] {
                let won = winner == seat, lost = winner == seat.other, drew = winner == nil
                try tx.execute(
                    """
                    INSERT INTO stats (user_id, matches_played, wins, losses, draws, moves_played, steps_played, wins_by_goal, quits,
                                       current_streak, best_streak, last_played_at)
                    VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(user_id) DO UPDATE SET
                        matches_played = matches_played + 1, wins = wins + excluded.wins, losses = losses + excluded.losses,
                        draws = draws + excluded.draws, moves_played = moves_played + excluded.moves_played,
                        steps_played = steps_played + excluded.steps_played, wins_by_goal = wins_by_goal + excluded.wins_by_goal,
                        quits = quits + excluded.quits,
                        current_streak = CASE WHEN excluded.wins = 1 THEN current_streak + 1 ELSE 0 END,
                        best_streak = max(best_streak, CASE WHEN excluded.wins = 1 THEN current_streak + 1 ELSE 0 END),
                        last_played_at = excluded.last_played_at
                    """,
                    m.players[seat.index], won, lost && !drew, drew && winner == nil, turns[seat.index], steps[seat.index],
                    won && reason == .goalReached, reason == .quit && forfeit == seat, won ? 1 : 0, won ? 1 : 0, now)
            }
        }

        if reason == .accountDeleted {
            m.windowClosesAt = nil
            m.rematchState = .declined
        } else {
            m.windowClosesAt = now + configuration.rematchWindow.milliseconds
        }
        let finalOutcome = outcome
        try appendEvent(tx, &m, now: now, effects: &effects) { e in
            var over = Matchmaking_V1_MatchOver()
            over.outcome = finalOutcome
            e.matchOver = over
        }
    }

    /// Deletes the event logs of matches finished in [`from`, `before`) (a range of the
    /// `matches_finished` index).
    static func purgeEventLogs(_ tx: Transaction, finishedFrom from: Int64, before: Int64) throws {
        try tx.execute(purgeEventLogsSQL, from, before)
    }

    static let purgeEventLogsSQL =
        "DELETE FROM match_events WHERE match_id IN (SELECT id FROM matches WHERE status = 2 AND finished_at >= ? AND finished_at < ?)"

    /// Ends `m` by the turn deadline when it has passed (the seat to move loses).
    @discardableResult
    static func expireTurnIfDue(
        _ tx: Transaction, _ m: inout MatchRecord, now: Int64, configuration: MatchmakingConfiguration, effects: inout Effects
    ) throws -> Bool {
        guard m.isActive, let deadline = m.turnDeadline, deadline <= now else { return false }
        let loser = GameSeat.toMove(turn: m.turnNumber)
        try finish(tx, &m, winner: loser.other, reason: .timeout, forfeit: loser, now: now, configuration: configuration, effects: &effects)
        try m.save(tx)
        return true
    }

    /// Closes the rematch window of `m` when it has passed: an unanswered request (or none) is
    /// DECLINED, and watchers hear it.
    @discardableResult
    static func closeWindowIfDue(_ tx: Transaction, _ m: inout MatchRecord, now: Int64, effects: inout Effects) throws -> Bool {
        guard !m.isActive, let closes = m.windowClosesAt, closes <= now else { return false }
        m.windowClosesAt = nil
        if m.rematchState == .unspecified || m.rematchState == .waiting {
            m.rematchState = .declined
            try appendRematch(tx, &m, .declined, now: now, effects: &effects)
        }
        try m.save(tx)
        return true
    }
}

extension Google_Protobuf_Duration {
    init(milliseconds ms: Int64) {
        self.init()
        seconds = ms / 1000
        nanos = Int32((ms % 1000) * 1_000_000)
    }
}
