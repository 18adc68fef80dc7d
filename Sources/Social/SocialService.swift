import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

/// `social.v1.Social`: teams, households, friends and blocks, follows, notifications. Every
/// handler validates the whole request first (one INVALID_ARGUMENT naming every bad field), reads
/// what it needs (peers with a short deadline), then writes in one transaction that checks again
/// and queues its effects (notifications, outbox calls) in that same transaction.
public struct SocialService: Social_V1_SocialService {
    let core: SocialCore

    /// The caller as a user reference (cached, else from accounts).
    func me(_ id: CallerIdentity) async throws -> Common_V1_UserRef {
        guard let u = try await core.directory.user(id: id.userID) else {
            throw RPCError(.unauthenticated, "the account of this access token no longer exists")
        }
        return u
    }

    static func name(_ u: Common_V1_UserRef) -> String { u.displayName.isEmpty ? u.username : u.displayName }

    // MARK: Retried creations

    /// The `idempotency_key` of a creation a client may retry (CreateTeam, CreateHousehold,
    /// InviteHousemate): optional in social, so nil when the request has none (then every request
    /// is a new one, as before the key existed); kept `Idempotency.keepFor` (hourly upkeep).
    static func retryKey(_ method: String, caller: CallerIdentity, key: String, request: some ProtoMessage) -> Idempotency.Key? {
        Idempotency.Key(method, caller: caller.userID, key: key, request: request)
    }

    /// The answer stored for an earlier request with `retry`'s key, read before any peer is asked
    /// (a retry is answered while accounts is down, and resolves nobody again). The write decides
    /// again (`Transaction.once`): a concurrent first request may store the key meanwhile.
    func storedAnswer<Response: ProtoMessage>(_ retry: Idempotency.Key?, as _: Response.Type) async throws -> Response? {
        try await core.store.storedAnswer(retry, as: Response.self)
    }

    // MARK: Teams (seed A)

    public func createTeam(request: Social_V1_CreateTeamRequest, context: ServerContext) async throws -> Social_V1_CreateTeamResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let name = SocialRules.name(request.name, into: &errors)
        let maxOthers = core.configuration.maxTeamMembers - 1
        if request.memberUsernames.count > maxOthers { errors.add("member_usernames", "at most \(maxOthers) other members") }
        var usernames: [(index: Int, name: String)] = []
        for (i, raw) in request.memberUsernames.prefix(maxOthers).enumerated() {
            let v = FieldRules.trimmed(raw)
            if v.isEmpty || FieldRules.length(v) > 64 || FieldRules.hasControlCharacters(v) {
                errors.add("member_usernames[\(i)]", v.isEmpty ? "required" : "is not a username")
            } else {
                usernames.append((i, v))
            }
        }
        FieldRules.idempotencyKey(request.idempotencyKey, required: false, into: &errors)
        try errors.throwIfAny()
        let retry = Self.retryKey("CreateTeam", caller: caller, key: request.idempotencyKey, request: request)
        if let earlier = try await storedAnswer(retry, as: Social_V1_CreateTeamResponse.self) { return earlier }

        let me = try await me(caller)
        let resolved = try await core.directory.users(usernames: usernames.map(\.name))
        // Duplicates and the caller's own username are ignored; the first mention is the index.
        var members: [(index: Int, user: Common_V1_UserRef)] = []
        var unknown = FieldErrors()
        var seen: Set<String> = [me.userId]
        for (i, n) in usernames {
            if let u = resolved.found[n] {
                if seen.insert(u.userId).inserted { members.append((i, u)) }
            } else {
                unknown.add("member_usernames[\(i)]", "no such user")
            }
        }
        if !unknown.isEmpty {
            // One answer names every member who cannot be added, unknown or not: the client fixes
            // the list once instead of learning of the taken members on the next try.
            let known = members
            let taken = try await core.store.read { c in
                var e = FieldErrors()
                try Self.unjoinable(c, me: me.userId, known, into: &e)
                return e
            }
            for v in taken.violations { unknown.add(v.field, v.description) }
            throw unknown.error(summary: taken.isEmpty ? "unknown usernames" : "unknown usernames and members who cannot join this team")
        }

        let others = members
        let teamID = ULID.make(now: core.now())
        let now = core.now()
        return try await core.writePublishing { tx, out -> Social_V1_CreateTeamResponse in
            try tx.once(retry, now: now) {
                if try tx.queryOne("SELECT 1 FROM team_members WHERE user_id = ?", me.userId) != nil {
                    throw RPCError(.failedPrecondition, "you are already in a team: leave it first")
                }
                var taken = FieldErrors()
                try Self.unjoinable(tx, me: me.userId, others, into: &taken)
                try taken.throwIfAny(.failedPrecondition, summary: "members who cannot join this team")
                try tx.execute(
                    "INSERT INTO teams (id, name, score, score_reached_at, created_by, created_at) VALUES (?, ?, 0, ?, ?, ?)",
                    teamID, name, now, me.userId, now)
                for (position, user) in ([me] + others.map(\.user)).enumerated() {
                    try tx.execute(
                        "INSERT INTO team_members (user_id, team_id, position, joined_at) VALUES (?, ?, ?, ?)",
                        user.userId, teamID, position, now)
                }
                var target = Social_V1_NotificationTarget()
                target.teamId = teamID
                for m in others {
                    _ = try Inbox.store(
                        tx, recipient: m.user.userId,
                        .init(
                            kind: .teamJoined, title: "\(Self.name(me)) added you to the team \(name)", actor: me,
                            target: target, data: ["team_name": name]),
                        now: now, out: &out)
                }
                var response = Social_V1_CreateTeamResponse()
                response.team = try Teams.team(tx, id: teamID)!
                return response
            }
        }
    }

    /// Names each of `members` who cannot join the caller's new team: already in a team, blocked
    /// either way, or erased.
    static func unjoinable(
        _ db: some SQLReader, me: String, _ members: [(index: Int, user: Common_V1_UserRef)], into errors: inout FieldErrors
    ) throws {
        for m in members {
            if try db.queryOne("SELECT 1 FROM team_members WHERE user_id = ?", m.user.userId) != nil {
                errors.add("member_usernames[\(m.index)]", "\(m.user.username) is already in a team")
            } else if try blockedEitherWay(db, me, m.user.userId)
                || db.queryOne("SELECT 1 FROM erased_users WHERE id = ?", m.user.userId) != nil
            {
                // A block (either way) keeps users apart; which side blocked is not told.
                errors.add("member_usernames[\(m.index)]", "\(m.user.username) cannot be added to your team")
            }
        }
    }

    public func getMyTeam(request: Social_V1_GetMyTeamRequest, context: ServerContext) async throws -> Social_V1_GetMyTeamResponse {
        let caller = try core.caller(context)
        let team = try await core.store.read { c in try Teams.team(c, ofUser: caller.userID) }
        var response = Social_V1_GetMyTeamResponse()
        if let team { response.team = team }
        return response
    }

    public func listTeamRanking(request: Social_V1_ListTeamRankingRequest, context: ServerContext) async throws -> Social_V1_ListTeamRankingResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "team-ranking", parts: 3, into: &errors).flatMap(RankKey.init(cursor:))
        try errors.throwIfAny()
        let (entries, more, mine) = try await core.store.read { c -> ([Teams.Ranked], Bool, Teams.Ranked?) in
            let (entries, more) = try Teams.ranking(c, after: cursor, limit: size)
            let mine = try Teams.teamID(c, ofUser: caller.userID).flatMap { try Teams.entry(c, teamID: $0) }
            return (entries, more, mine)
        }
        var response = Social_V1_ListTeamRankingResponse()
        response.entries = entries.map { $0.entry }
        if more, let last = entries.last { response.nextPageToken = core.pageTokens.make(cursor: last.key.cursor, filters: "team-ranking") }
        if let mine { response.myTeam = mine.entry }
        return response
    }

    public func leaveTeam(request: Social_V1_LeaveTeamRequest, context: ServerContext) async throws -> Social_V1_LeaveTeamResponse {
        let caller = try core.caller(context)
        let deleted = try await core.store.write { tx -> Bool in
            guard let teamID = try Teams.teamID(tx, ofUser: caller.userID) else {
                throw RPCError(.failedPrecondition, "you are in no team")
            }
            return try Teams.leave(tx, userID: caller.userID, teamID: teamID)
        }
        var response = Social_V1_LeaveTeamResponse()
        response.teamDeleted = deleted
        return response
    }
}

/// Team queries shared by the handlers.
enum Teams {
    static func teamID(_ db: some SQLReader, ofUser user: String) throws -> String? {
        try db.queryOne("SELECT team_id FROM team_members WHERE user_id = ?", user)?.get(0)
    }

    static func key(_ row: Row) throws -> RankKey {
        RankKey(score: try row.get("score"), reachedAt: try row.get("score_reached_at"), teamID: try row.get("id"))
    }

    /// 1 + the teams ranked before `key`.
    static func rank(_ db: some SQLReader, _ key: RankKey) throws -> Int32 {
        let ahead = try db.queryOne(
            """
            SELECT count(*) FROM teams WHERE score > ?1 OR (score = ?1 AND (score_reached_at < ?2 OR (score_reached_at = ?2 AND id < ?3)))
            """, key.score, key.reachedAt, key.teamID)!.get(0, as: Int64.self)
        return Int32(clamping: ahead + 1)
    }

    static func members(_ db: some SQLReader, teamID: String) throws -> [Common_V1_UserRef] {
        try db.query(
            """
            SELECT u.id, u.username, u.display_name FROM team_members m JOIN users u ON u.id = m.user_id
            WHERE m.team_id = ? ORDER BY m.position
            """, teamID
        ).map(UserDirectory.ref)
    }

    static func team(_ db: some SQLReader, id: String) throws -> Social_V1_Team? {
        guard let row = try db.queryOne("SELECT id, name, score, score_reached_at, created_at FROM teams WHERE id = ?", id) else { return nil }
        var t = Social_V1_Team()
        t.teamId = id
        t.name = try row.get("name")
        t.score = try row.get("score")
        t.rank = try rank(db, key(row))
        t.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("created_at"))
        t.members = try members(db, teamID: id)
        return t
    }

    static func team(_ db: some SQLReader, ofUser user: String) throws -> Social_V1_Team? {
        try teamID(db, ofUser: user).flatMap { try team(db, id: $0) }
    }

    struct Ranked: Sendable { var key: RankKey; var entry: Social_V1_TeamRankingEntry }

    static func entry(_ db: some SQLReader, teamID: String) throws -> Ranked? {
        guard
            let row = try db.queryOne(
                "SELECT id, name, score, score_reached_at, (SELECT count(*) FROM team_members m WHERE m.team_id = teams.id) AS n FROM teams WHERE id = ?",
                teamID)
        else { return nil }
        let k = try key(row)
        return Ranked(key: k, entry: try entry(row, rank: try rank(db, k)))
    }

    static func entry(_ row: Row, rank: Int32) throws -> Social_V1_TeamRankingEntry {
        var e = Social_V1_TeamRankingEntry()
        e.rank = rank
        e.teamId = try row.get("id")
        e.name = try row.get("name")
        e.score = try row.get("score")
        e.memberCount = Int32(clamping: try row.get("n", as: Int64.self))
        return e
    }

    /// A page of the ranking after `cursor`; whether more follow.
    static func ranking(_ db: some SQLReader, after cursor: RankKey?, limit: Int) throws -> ([Ranked], Bool) {
        let select = "SELECT id, name, score, score_reached_at, (SELECT count(*) FROM team_members m WHERE m.team_id = teams.id) AS n FROM teams"
        let order = "ORDER BY score DESC, score_reached_at, id LIMIT ?"
        let rows: [Row]
        var first: Int32 = 1
        if let c = cursor {
            rows = try db.query(
                "\(select) WHERE score < ?1 OR (score = ?1 AND (score_reached_at > ?2 OR (score_reached_at = ?2 AND id > ?3))) ORDER BY score DESC, score_reached_at, id LIMIT ?4",
                c.score, c.reachedAt, c.teamID, limit + 1)
            first = try rank(db, c) + 1
        } else {
            rows = try db.query("\(select) \(order)", limit + 1)
        }
        var out: [Ranked] = []
        for (i, row) in rows.prefix(limit).enumerated() {
            out.append(Ranked(key: try key(row), entry: try entry(row, rank: first + Int32(i))))
        }
        return (out, rows.count > limit)
    }

    /// Removes `userID` from `teamID`; deletes the team when it was the last member.
    static func leave(_ tx: Transaction, userID: String, teamID: String) throws -> Bool {
        try tx.execute("DELETE FROM team_members WHERE user_id = ?", userID)
        if try tx.queryOne("SELECT 1 FROM team_members WHERE team_id = ?", teamID) == nil {
            try tx.execute("DELETE FROM teams WHERE id = ?", teamID)
            return true
        }
        return false
    }
}

extension Transaction {
    /// `make` once per `retry` key (the kit's `idempotent`: the answer is stored with the effects
    /// in this transaction; a repeat gets it back and `make` does not run, so its notifications
    /// and outbox calls happen once), or every time when the request has no key.
    func once<Response: ProtoMessage>(_ retry: Idempotency.Key?, now: Int64, _ make: () throws -> Response) throws -> Response {
        guard let retry else { return try make() }
        return try idempotent(scope: retry.scope, key: retry.key, fingerprint: retry.fingerprint, now: now, make).response
    }
}
