import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

extension MatchmakingService {
    // MARK: Statistics and ratings (E 4.3, 5.5)

    public func getPlayerStats(
        request: Matchmaking_V1_GetPlayerStatsRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_GetPlayerStatsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        var user = FieldRules.id(request.userId, field: "user_id", required: false, into: &errors)
        try errors.throwIfAny()
        if user.isEmpty { user = caller.userID }
        let ref: Common_V1_UserRef
        if user == caller.userID {
            ref = await core.directory.bestEffort(id: user)
        } else {
            guard let found = try await core.directory.user(id: user) else {
                throw FieldErrors.single(.notFound, field: "user_id", "no such user")
            }
            ref = found
            let relation = try await core.relations.fresh(caller.userID, user)
            if !relation.friends || relation.blocked {
                throw FieldErrors.single(.permissionDenied, field: "user_id", "only your friends' statistics are visible to you")
            }
        }
        let target = user
        let stats = try await core.store.read { c in try Self.stats(c, target, ref: ref) }
        var r = Matchmaking_V1_GetPlayerStatsResponse()
        r.stats = stats
        return r
    }

    static func stats(_ c: some SQLReader, _ user: String, ref: Common_V1_UserRef) throws -> Matchmaking_V1_PlayerStats {
        var s = Matchmaking_V1_PlayerStats()
        s.user = ref
        if let row = try c.queryOne("SELECT * FROM stats WHERE user_id = ?", user) {
            s.matchesPlayed = Int32(try row.get("matches_played", as: Int.self))
            s.wins = Int32(try row.get("wins", as: Int.self))
            s.losses = Int32(try row.get("losses", as: Int.self))
            s.draws = Int32(try row.get("draws", as: Int.self))
            s.movesPlayed = try row.get("moves_played")
            let steps: Int64 = try row.get("steps_played")
            s.winsByGoal = Int32(try row.get("wins_by_goal", as: Int.self))
            s.quits = Int32(try row.get("quits", as: Int.self))
            s.currentWinStreak = Int32(try row.get("current_streak", as: Int.self))
            s.bestWinStreak = Int32(try row.get("best_streak", as: Int.self))
            if let last = try row.get("last_played_at", as: Int64?.self) { s.lastPlayedAt = Google_Protobuf_Timestamp(milliseconds: last) }
            if s.matchesPlayed > 0 {
                s.winRate = Double(s.wins) / Double(s.matchesPlayed)
                s.averageMovesPerMatch = Double(s.movesPlayed) / Double(s.matchesPlayed)
            }
            if s.movesPlayed > 0 { s.averageStepsPerMove = Double(steps) / Double(s.movesPlayed) }
        }
        s.rating = try RatingRecord.load(c, user).proto
        return s
    }

    public func getRating(request: Matchmaking_V1_GetRatingRequest, context: ServerContext) async throws -> Matchmaking_V1_GetRatingResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        var user = FieldRules.id(request.userId, field: "user_id", required: false, into: &errors)
        try errors.throwIfAny()
        if user.isEmpty { user = caller.userID }
        let target = user
        let (record, known) = try await core.store.read { c in
            (try RatingRecord.load(c, target), try c.queryOne("SELECT 1 FROM ratings WHERE user_id = ?", target) != nil)
        }
        var ref: Common_V1_UserRef
        if target == caller.userID || known {
            ref = await core.directory.bestEffort(id: target)
        } else {
            guard let found = try await core.directory.user(id: target) else {
                throw FieldErrors.single(.notFound, field: "user_id", "no such user")
            }
            ref = found
        }
        var r = Matchmaking_V1_GetRatingResponse()
        r.user = ref
        r.rating = record.proto
        r.rank = Int32(core.ranks.rank(of: target) ?? 0)
        return r
    }

    // MARK: Leaderboard (E 5.4)

    public func getLeaderboard(
        request: Matchmaking_V1_GetLeaderboardRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_GetLeaderboardResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, defaultSize: 10, into: &errors)
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "leaderboard", parts: 4, into: &errors)
        try errors.throwIfAny()
        // The next page starts after the last row shown (by its key: stable while ranks move).
        var from = 0
        if let c = cursor, let rating = Double(c[0]), let deviation = Double(c[1]), let at = Int64(c[2]) {
            let key = RankIndex.Key(rating: rating, deviation: deviation, reachedAt: at, userID: c[3])
            from = core.ranks.position(of: key)
            if core.ranks.page(from: from, limit: 1).first?.key == key { from += 1 }  // the row itself is still there
        }
        let rows = core.ranks.page(from: from, limit: size + 1)
        let myRank = core.ranks.rank(of: caller.userID)
        let shown = Array(rows.prefix(size))
        let ids = shown.map(\.key.userID) + [caller.userID]
        let (users, records) = try await core.store.read { c -> ([String: Common_V1_UserRef], [String: (Int32, Int32)]) in
            var wl: [String: (Int32, Int32)] = [:]
            for id in ids {
                if let row = try c.queryOne("SELECT wins, losses FROM stats WHERE user_id = ?", id) {
                    wl[id] = (Int32(try row.get("wins", as: Int.self)), Int32(try row.get("losses", as: Int.self)))
                }
            }
            return (try UserNames.refs(c, ids: ids), wl)
        }
        func entry(rank: Int, key: RankIndex.Key) -> Matchmaking_V1_LeaderboardEntry {
            var e = Matchmaking_V1_LeaderboardEntry()
            e.rank = Int32(rank)
            e.user = MatchRecord.ref(key.userID, users)
            e.rating = key.rating
            e.deviation = key.deviation
            e.wins = records[key.userID]?.0 ?? 0
            e.losses = records[key.userID]?.1 ?? 0
            return e
        }
        var r = Matchmaking_V1_GetLeaderboardResponse()
        r.entries = shown.map { entry(rank: $0.rank, key: $0.key) }
        if rows.count > size, let last = shown.last?.key {
            r.nextPageToken = core.pageTokens.make(
                cursor: ["\(last.rating)", "\(last.deviation)", "\(last.reachedAt)", last.userID], filters: "leaderboard")
        }
        if let myRank, let mine = core.ranks.page(from: myRank - 1, limit: 1).first, mine.key.userID == caller.userID {
            r.me = entry(rank: mine.rank, key: mine.key)
        }
        r.rankedPlayers = Int32(core.ranks.count)
        return r
    }
}
