import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

/// One `challenges` row.
struct ChallengeRecord: Sendable {
    var id: String
    var challenger: String
    var challenged: String
    var status: Matchmaking_V1_ChallengeStatus
    var rated: Bool
    var message: String
    var createdAt: Int64
    var expiresAt: Int64
    var matchID: String

    static let columns = "id, challenger_id, challenged_id, status, rated, message, created_at, expires_at, match_id"

    init(row: Row) throws {
        id = try row.get("id")
        challenger = try row.get("challenger_id")
        challenged = try row.get("challenged_id")
        status = Matchmaking_V1_ChallengeStatus(rawValue: Int32(try row.get("status", as: Int.self)))
        rated = try row.get("rated")
        message = try row.get("message")
        createdAt = try row.get("created_at")
        expiresAt = try row.get("expires_at")
        matchID = try row.get("match_id")
    }

    static func load(_ db: some SQLReader, _ id: String) throws -> ChallengeRecord? {
        try db.queryOne("SELECT \(columns) FROM challenges WHERE id = ?", id).map(ChallengeRecord.init(row:))
    }

    /// PENDING past its expiry reads EXPIRED (the upkeep loop writes it down soon after).
    func status(now: Int64) -> Matchmaking_V1_ChallengeStatus { status == .pending && expiresAt <= now ? .expired : status }

    func proto(_ users: [String: Common_V1_UserRef], now: Int64) -> Matchmaking_V1_Challenge {
        var c = Matchmaking_V1_Challenge()
        c.challengeId = id
        c.challenger = MatchRecord.ref(challenger, users)
        c.challenged = MatchRecord.ref(challenged, users)
        c.status = status(now: now)
        c.rated = rated
        c.message = message
        c.createdAt = Google_Protobuf_Timestamp(milliseconds: createdAt)
        c.expiresAt = Google_Protobuf_Timestamp(milliseconds: expiresAt)
        c.matchId = matchID
        return c
    }
}

extension MatchmakingService {
    // MARK: Challenges (E 2.5)

    public func createChallenge(
        request: Matchmaking_V1_CreateChallengeRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_CreateChallengeResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let message = FieldRules.text(request.message, field: "message", 0...100, into: &errors)
        var byUsername: String?
        var byID: String?
        switch request.opponent {
        case .opponentUsername(let raw)?:
            let v = FieldRules.trimmed(raw)
            if v.isEmpty || FieldRules.length(v) > 64 || FieldRules.hasControlCharacters(v) {
                errors.add("opponent_username", v.isEmpty ? "required" : "is not a username")
            } else {
                byUsername = v
            }
        case .opponentUserId(let raw)?:
            let v = FieldRules.id(raw, field: "opponent_user_id", into: &errors)
            if !v.isEmpty {
                byID = v
                if v == caller.userID { errors.add("opponent_user_id", "you cannot challenge yourself") }
            }
        case nil:
            errors.add("opponent", "required: opponent_username or opponent_user_id")
        }
        try errors.throwIfAny()

        // A retry is answered from its key before any peer is asked (it works while they are down).
        let scope = "CreateChallenge:\(caller.userID)", fingerprint = Idempotency.fingerprint(request), key = request.idempotencyKey
        if var replay = try await core.store.read({ c in
            try c.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Matchmaking_V1_CreateChallengeResponse.self)
        }) {
            replay.replayed = true
            return replay
        }

        // Who: accounts; the relationship: social, asked afresh (short deadline; UNAVAILABLE while down).
        let field = byUsername != nil ? "opponent_username" : "opponent_user_id"
        let found: Common_V1_UserRef?
        if let byUsername { found = try await core.directory.user(username: byUsername) } else { found = try await core.directory.user(id: byID!) }
        guard let opponent = found else { throw FieldErrors.single(.notFound, field: field, "no such user") }
        if opponent.userId == caller.userID { throw FieldErrors.single(.invalidArgument, field: field, "you cannot challenge yourself") }
        let relation = try await core.relations.fresh(caller.userID, opponent.userId)
        if relation.blocked { throw RPCError(.permissionDenied, "you cannot challenge this player") }
        if !relation.friends { throw RPCError(.permissionDenied, "you can only challenge your friends") }
        let me = await core.directory.bestEffort(id: caller.userID)

        let now = core.now(), id = ULID.make(now: now), lifetime = core.configuration.challengeLifetime.milliseconds
        let (response, replayed) = try await core.write { tx, _ in
            // An erased account (its access token still valid) challenges nobody; an opponent
            // erased since the lookup is no user any more.
            if try MatchStore.isErased(tx, caller.userID) { throw MatchStore.callerErased }
            if try MatchStore.isErased(tx, opponent.userId) { throw FieldErrors.single(.notFound, field: field, "no such user") }
            return try tx.idempotent(
                scope: scope, key: key, fingerprint: fingerprint, now: now
            ) {
                let low = min(caller.userID, opponent.userId), high = max(caller.userID, opponent.userId)
                try tx.execute(
                    "UPDATE challenges SET status = 5 WHERE pair_low = ? AND pair_high = ? AND status = 1 AND expires_at <= ?", low, high, now)
                if try tx.queryOne("SELECT 1 FROM challenges WHERE pair_low = ? AND pair_high = ? AND status = 1", low, high) != nil {
                    throw FieldErrors.single(.alreadyExists, field: field, "a pending challenge between you already exists")
                }
                try tx.execute(
                    """
                    INSERT INTO challenges (id, challenger_id, challenged_id, pair_low, pair_high, status, rated, message, created_at, expires_at)
                    VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?)
                    """, id, caller.userID, opponent.userId, low, high, request.rated, message, now, now + lifetime)
                try Notify.send(
                    tx, eventID: "matchmaking:challenge:\(id)", to: [opponent.userId], kind: .challenge,
                    title: "\(Names.name(me)) challenges you to a \(request.rated ? "rated" : "friendly") match", body: message,
                    actor: caller.userID, challengeID: id)
                var r = Matchmaking_V1_CreateChallengeResponse()
                r.challenge = try ChallengeRecord.load(tx, id)!.proto(try UserNames.refs(tx, ids: [caller.userID, opponent.userId]), now: now)
                return r
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    public func acceptChallenge(
        request: Matchmaking_V1_AcceptChallengeRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_AcceptChallengeResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.challengeId, field: "challenge_id", into: &errors)
        try errors.throwIfAny()
        // A block made since the challenge was sent cancels it (social asked, short deadline).
        if let c = try await core.store.read({ c in try ChallengeRecord.load(c, id) }), c.challenged == caller.userID, c.status == .pending {
            if try await core.relations.fresh(c.challenger, c.challenged).blocked {
                throw RPCError(.permissionDenied, "you cannot play this player")
            }
        }
        let now = core.now(), matchID = ULID.make(now: now), configuration = core.configuration, hub = core.hub
        return try await core.write { tx, effects in
            let c = try Self.challenge(tx, id, caller.userID, as: .challenged)
            var r = Matchmaking_V1_AcceptChallengeResponse()
            let users = try UserNames.refs(tx, ids: [c.challenger, c.challenged])  // the match's players too
            if c.status == .accepted, let m = try MatchRecord.load(tx, c.matchID) {  // a retried accept
                r.challenge = c.proto(users, now: now)
                r.match = MatchStore.proto(m, users: users, hub: hub)
                return r
            }
            try Self.requirePending(c, now: now)
            let m = try MatchStore.create(
                tx, id: matchID, kind: .challenge, rated: c.rated, players: [c.challenger, c.challenged], caller: caller.userID,
                columns: GameState.defaultSize, rows: GameState.defaultSize, rematchOf: "", now: now, configuration: configuration,
                effects: &effects)
            try tx.execute("UPDATE challenges SET status = 2, match_id = ? WHERE id = ?", matchID, id)
            try Notify.send(
                tx, eventID: "matchmaking:challenge-answered:\(id)", to: [c.challenger], kind: .challengeAnswered,
                title: "\(Names.name(MatchRecord.ref(c.challenged, users))) accepted your challenge", actor: c.challenged, matchID: matchID,
                data: ["answer": "accepted", "challenge_id": id])
            r.challenge = try ChallengeRecord.load(tx, id)!.proto(users, now: now)
            r.match = MatchStore.proto(m, users: users, hub: hub)
            return r
        }
    }

    public func rejectChallenge(
        request: Matchmaking_V1_RejectChallengeRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_RejectChallengeResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.challengeId, field: "challenge_id", into: &errors)
        try errors.throwIfAny()
        var r = Matchmaking_V1_RejectChallengeResponse()
        r.challenge = try await close(challenge: id, by: caller.userID, as: .challenged, to: .rejected) { tx, c, users in
            try Notify.send(
                tx, eventID: "matchmaking:challenge-answered:\(id)", to: [c.challenger], kind: .challengeAnswered,
                title: "\(Names.name(MatchRecord.ref(c.challenged, users))) declined your challenge", actor: c.challenged, challengeID: id,
                data: ["answer": "rejected"])
        }
        return r
    }

    public func cancelChallenge(
        request: Matchmaking_V1_CancelChallengeRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_CancelChallengeResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.challengeId, field: "challenge_id", into: &errors)
        try errors.throwIfAny()
        var r = Matchmaking_V1_CancelChallengeResponse()
        r.challenge = try await close(challenge: id, by: caller.userID, as: .challenger, to: .cancelled)
        return r
    }

    /// Rejects (the challenged player) or withdraws (the challenger) a pending challenge, then
    /// `then` in the same transaction; the same answer again returns the challenge (a retry).
    func close(
        challenge id: String, by userID: String, as side: ChallengeSide, to status: Matchmaking_V1_ChallengeStatus,
        then: @escaping @Sendable (Transaction, ChallengeRecord, [String: Common_V1_UserRef]) throws -> Void = { _, _, _ in }
    ) async throws -> Matchmaking_V1_Challenge {
        let now = core.now()
        return try await core.write { tx, _ in
            let c = try Self.challenge(tx, id, userID, as: side)
            let users = try UserNames.refs(tx, ids: [c.challenger, c.challenged])
            if c.status == status { return c.proto(users, now: now) }
            try Self.requirePending(c, now: now)
            try tx.execute("UPDATE challenges SET status = ? WHERE id = ?", Int(status.rawValue), id)
            try then(tx, c, users)
            return try ChallengeRecord.load(tx, id)!.proto(users, now: now)
        }
    }

    /// Who acts on a challenge: the challenged player answers it, the challenger withdraws it.
    enum ChallengeSide { case challenged, challenger }

    /// A challenge `userID` is part of, on `side` (NOT_FOUND for strangers, PERMISSION_DENIED for
    /// the other side).
    static func challenge(_ tx: Transaction, _ id: String, _ userID: String, as side: ChallengeSide) throws -> ChallengeRecord {
        guard let c = try ChallengeRecord.load(tx, id), c.challenger == userID || c.challenged == userID else {
            throw FieldErrors.single(.notFound, field: "challenge_id", "no such challenge")
        }
        switch side {
        case .challenged where c.challenged != userID:
            throw FieldErrors.single(.permissionDenied, field: "challenge_id", "only the challenged player answers a challenge")
        case .challenger where c.challenger != userID:
            throw FieldErrors.single(.permissionDenied, field: "challenge_id", "only the challenger can withdraw a challenge: reject it instead")
        default:
            return c
        }
    }

    static func requirePending(_ c: ChallengeRecord, now: Int64) throws {
        let status = c.status(now: now)
        guard status == .pending else {
            let word =
                switch status {
                case .accepted: "accepted"
                case .rejected: "rejected"
                case .cancelled: "withdrawn"
                default: "expired"
                }
            throw FieldErrors.single(.failedPrecondition, field: "challenge_id", "the challenge is no longer pending (\(word))")
        }
    }

    public func listChallenges(
        request: Matchmaking_V1_ListChallengesRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_ListChallengesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        if !(0...2).contains(request.direction.rawValue) { errors.add("direction", "unknown direction") }
        var statuses = Set<Int32>()
        for (i, s) in request.statuses.enumerated() {
            if (1...5).contains(s.rawValue) {
                statuses.insert(s.rawValue)
            } else if s.rawValue == 0 {
                statuses.insert(1)
            } else {
                errors.add("statuses[\(i)]", "unknown status")
            }
        }
        if statuses.isEmpty { statuses = [1] }
        let wanted = statuses.sorted().map(String.init).joined(separator: ",")
        let filters = "challenges:\(caller.userID):\(request.direction.rawValue):\(statuses.sorted())"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors)
        try errors.throwIfAny()
        let now = core.now()
        let (rows, users) = try await core.store.read { c -> ([ChallengeRecord], [String: Common_V1_UserRef]) in
            var sql = "SELECT \(ChallengeRecord.columns) FROM challenges WHERE "
            var args: [DatabaseValue] = []
            switch request.direction {
            case .incoming:
                sql += "challenged_id = ?"
                args = [.text(caller.userID)]
            case .outgoing:
                sql += "challenger_id = ?"
                args = [.text(caller.userID)]
            default:
                sql += "(challenger_id = ? OR challenged_id = ?)"
                args = [.text(caller.userID), .text(caller.userID)]
            }
            // The stored status, with PENDING past its expiry counted as EXPIRED.
            sql += """
                 AND (CASE WHEN status = 1 AND expires_at <= ? THEN 5 ELSE status END) IN (\(wanted))
                """
            args.append(.integer(now))
            if let after = cursor?.first {
                sql += " AND id < ?"
                args.append(.text(after))
            }
            sql += " ORDER BY id DESC LIMIT ?"
            args.append(.integer(Int64(size + 1)))
            let rows = try c.query(sql, arguments: args).map(ChallengeRecord.init(row:))
            return (rows, try UserNames.refs(c, ids: rows.flatMap { [$0.challenger, $0.challenged] }))
        }
        var r = Matchmaking_V1_ListChallengesResponse()
        r.challenges = rows.prefix(size).map { $0.proto(users, now: now) }
        if rows.count > size, let last = r.challenges.last { r.nextPageToken = core.pageTokens.make(cursor: [last.challengeId], filters: filters) }
        return r
    }
}
