import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

/// `matchmaking.v1.Matchmaking`. Every handler validates the whole request first (one
/// INVALID_ARGUMENT naming every bad field), reads what it needs (peers with a short deadline),
/// then writes in one transaction that checks again and queues its effects (notifications through
/// social's outbox, events to watchers after the commit).
public struct MatchmakingService: Matchmaking_V1_MatchmakingService {
    let core: MatchmakingCore

    /// A match the caller plays, or NOT_FOUND (others never learn it exists).
    static func playerMatch(_ db: some SQLReader, _ id: String, _ userID: String) throws -> MatchRecord {
        guard let m = try MatchRecord.load(db, id), m.seat(of: userID) != nil else {
            throw FieldErrors.single(.notFound, field: "match_id", "no such match among yours")
        }
        return m
    }

    static func matchID(_ raw: String, into errors: inout FieldErrors) -> String {
        FieldRules.id(raw, field: "match_id", into: &errors)
    }

    // MARK: Local play (E 4.1)

    public func startLocalMatch(
        request: Matchmaking_V1_StartLocalMatchRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_StartLocalMatchResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let columns = Self.boardSize(request.columns, field: "columns", into: &errors)
        let rows = Self.boardSize(request.rows, field: "rows", into: &errors)
        try errors.throwIfAny()
        // Warms the name cache, so that the match's views can show the caller's name.
        _ = await core.directory.bestEffort(id: caller.userID)
        let now = core.now(), id = ULID.make(now: now), configuration = core.configuration, hub = core.hub
        let (response, replayed) = try await core.write { tx, effects in
            try tx.idempotent(
                scope: "StartLocalMatch:\(caller.userID)", key: request.idempotencyKey, fingerprint: Idempotency.fingerprint(request), now: now
            ) {
                let m = try MatchStore.create(
                    tx, id: id, kind: .local, rated: false, players: [caller.userID, caller.userID], caller: caller.userID, columns: columns,
                    rows: rows, rematchOf: "", now: now, configuration: configuration, effects: &effects)
                var r = Matchmaking_V1_StartLocalMatchResponse()
                r.match = try MatchStore.proto(tx, m, hub: hub)
                return r
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    static func boardSize(_ v: Int32, field: String, into errors: inout FieldErrors) -> Int {
        if v == 0 { return GameState.defaultSize }
        guard GameState.sizeRange.contains(Int(v)) else {
            errors.add(field, "must be 5 to 15 (0 means 9)")
            return GameState.defaultSize
        }
        return Int(v)
    }

    // MARK: Reading matches

    public func getMatch(request: Matchmaking_V1_GetMatchRequest, context: ServerContext) async throws -> Matchmaking_V1_GetMatchResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        try errors.throwIfAny()
        let hub = core.hub
        var r = Matchmaking_V1_GetMatchResponse()
        r.match = try await core.store.read { c in try MatchStore.proto(c, try Self.playerMatch(c, id, caller.userID), hub: hub) }
        return r
    }

    public func listMyMatches(
        request: Matchmaking_V1_ListMyMatchesRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_ListMyMatchesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        let opponent = FieldRules.id(request.opponentUserId, field: "opponent_user_id", required: false, into: &errors)
        if ![0, 1, 2].contains(request.status.rawValue) { errors.add("status", "unknown status") }
        if !(0...4).contains(request.kind.rawValue) { errors.add("kind", "unknown kind") }
        let filters = "my-matches:\(caller.userID):\(request.status.rawValue):\(request.kind.rawValue):\(opponent)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors)
        try errors.throwIfAny()
        let hub = core.hub
        let (matches, more) = try await core.store.read { c -> ([Match], Bool) in
            var sql = "SELECT \(MatchRecord.columns) FROM matches WHERE (first_id = ? OR second_id = ?)"
            var args: [DatabaseValue] = [.text(caller.userID), .text(caller.userID)]
            if request.status != .unspecified {
                sql += " AND status = ?"
                args.append(.integer(Int64(request.status.rawValue)))
            }
            if request.kind != .unspecified {
                sql += " AND kind = ?"
                args.append(.integer(Int64(request.kind.rawValue)))
            }
            if !opponent.isEmpty {
                sql += " AND ((first_id = ? AND second_id = ?) OR (second_id = ? AND first_id = ?))"
                args += [.text(caller.userID), .text(opponent), .text(caller.userID), .text(opponent)]
            }
            if let after = cursor?.first {
                sql += " AND id < ?"
                args.append(.text(after))
            }
            sql += " ORDER BY id DESC LIMIT ?"
            args.append(.integer(Int64(size + 1)))
            let records = try c.query(sql, arguments: args).map(MatchRecord.init(row:))
            let page = records.prefix(size)
            let users = try UserNames.refs(c, ids: page.flatMap(\.players))  // the page's names, each read once
            return (page.map { MatchStore.proto($0, users: users, hub: hub) }, records.count > size)
        }
        var r = Matchmaking_V1_ListMyMatchesResponse()
        r.matches = matches
        if more, let last = matches.last { r.nextPageToken = core.pageTokens.make(cursor: [last.matchId], filters: filters) }
        return r
    }

    // MARK: Moves (E 3.1, 3.2, 3.3)

    public func submitMove(request: Matchmaking_V1_SubmitMoveRequest, context: ServerContext) async throws -> Matchmaking_V1_SubmitMoveResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        if request.turnNumber < 1 {
            errors.add("turn_number", "required: the turn being played (Match.turn_number)")
        } else if request.turnNumber > 2 * GameState.turnsPerSeat {
            errors.add("turn_number", "must be 1 to \(2 * GameState.turnsPerSeat): a match has at most that many turns")
        }
        let input = Self.moveInput(request, into: &errors)
        try errors.throwIfAny()
        let now = core.now(), configuration = core.configuration, hub = core.hub
        let (response, notify) = try await core.write { tx, effects -> (Matchmaking_V1_SubmitMoveResponse, Bool) in
            var m = try Self.playerMatch(tx, id, caller.userID)
            if try MatchStore.expireTurnIfDue(tx, &m, now: now, configuration: configuration, effects: &effects) {
                return (Matchmaking_V1_SubmitMoveResponse(), true)  // the deadline passed: answered below, after the commit
            }
            let users = try UserNames.refs(tx, ids: m.players)
            let turn = Int(request.turnNumber)
            if turn < m.turnNumber {
                // A retry of a played turn returns what was recorded; anything else is refused.
                guard let stored = try MatchStore.moves(tx, m, users: users, after: turn - 1, limit: 1).first,
                    m.isLocal || m.players[stored.seat == .second ? 1 : 0] == caller.userID, Self.sameMove(stored, request)
                else {
                    throw FieldErrors.single(
                        .failedPrecondition, field: "turn_number", "turn \(turn) was already played (the match is at turn \(m.turnNumber))")
                }
                var r = Matchmaking_V1_SubmitMoveResponse()
                r.move = stored
                r.match = MatchStore.proto(m, users: users, hub: hub)
                r.replayed = true
                return (r, false)
            }
            guard m.isActive else { throw RPCError(.failedPrecondition, "the match is over") }
            if turn > m.turnNumber {
                throw FieldErrors.single(.failedPrecondition, field: "turn_number", "the match is at turn \(m.turnNumber), not \(turn)")
            }
            let seat = GameSeat.toMove(turn: m.turnNumber)
            if !m.isLocal && m.players[seat.index] != caller.userID {
                throw RPCError(.failedPrecondition, "it is not your turn: \(seat.name) is to move")
            }
            let game = m.game
            let validated: ValidatedMove
            switch GameRules.validate(input, dealt: m.dealt(turn: m.turnNumber), in: game) {
            case .success(let v): validated = v
            case .failure(let rejection):
                var e = FieldErrors()
                for v in rejection.violations { e.add(v.field, v.description) }
                throw e.error(summary: "illegal move")
            }
            let after = game.applying(validated)
            var move = try MatchStore.recordMove(tx, m, validated, now: now)
            move.player = MatchRecord.ref(m.players[seat.index], users)
            m.board = MatchRecord.board(after)
            m.turnNumber = after.turn
            m.turnStartedAt = now
            let outcome = GameRules.outcome(after: validated, state: after)
            m.turnDeadline = outcome == nil && !m.isLocal ? now + configuration.turnTimeout.milliseconds : nil
            let played = move, nextTurn = m.turnNumber, deadline = m.turnDeadline, next = m.dealt(turn: m.turnNumber)
            try MatchStore.appendEvent(tx, &m, now: now, effects: &effects) { e in
                var p = Matchmaking_V1_MovePlayed()
                p.move = played
                p.turnNumber = Int32(nextTurn)
                if outcome == nil {
                    p.seatToMove = GameSeat.toMove(turn: nextTurn).proto
                    p.nextShape = next.proto
                    if let deadline { p.turnDeadline = Google_Protobuf_Timestamp(milliseconds: deadline) }
                }
                e.movePlayed = p
            }
            switch outcome {
            case .goalReached(let winner)?:
                try MatchStore.finish(
                    tx, &m, winner: winner, reason: .goalReached, forfeit: nil, now: now, configuration: configuration, effects: &effects)
            case .turnLimit(let winner)?:
                try MatchStore.finish(
                    tx, &m, winner: winner, reason: .turnLimit, forfeit: nil, now: now, configuration: configuration, effects: &effects)
            case nil: break
            }
            try m.save(tx)
            var r = Matchmaking_V1_SubmitMoveResponse()
            r.move = move
            r.match = MatchStore.proto(m, users: users, hub: hub)
            return (r, false)
        }
        if notify { throw RPCError(.failedPrecondition, "the turn deadline passed: the match ended (TIMEOUT)") }
        return response
    }

    /// The request as the rules see it; enum values outside the contract are named here.
    static func moveInput(_ request: Matchmaking_V1_SubmitMoveRequest, into errors: inout FieldErrors) -> MoveInput {
        var placement: MoveInput.Placement?
        if request.hasPlacement {
            let p = request.placement
            if Shape(rawValue: Int(p.kind.rawValue)) == nil { errors.add("placement.kind", "required: the dealt shape (Match.next_shape)") }
            if !(0...3).contains(p.quarterTurns) { errors.add("placement.quarter_turns", "must be 0 to 3") }
            placement = MoveInput.Placement(
                kind: Int(p.kind.rawValue), anchor: p.hasAnchor ? Point(Int(p.anchor.column), Int(p.anchor.row)) : nil,
                quarterTurns: Int(p.quarterTurns))
        }
        if request.steps.count > GameState.maxSteps { errors.add("steps", "at most \(GameState.maxSteps) steps, got \(request.steps.count)") }
        for (i, s) in request.steps.prefix(GameState.maxSteps).enumerated() where Step(rawValue: Int(s.rawValue)) == nil {
            errors.add("steps[\(i)]", "must be UP, DOWN, LEFT or RIGHT")
        }
        return MoveInput(placement: placement, steps: request.steps.map { Int($0.rawValue) })
    }

    /// Whether a retried request asks for the move that was recorded.
    static func sameMove(_ stored: Matchmaking_V1_Move, _ request: Matchmaking_V1_SubmitMoveRequest) -> Bool {
        guard stored.hasPlacement == request.hasPlacement, stored.steps == request.steps else { return false }
        guard stored.hasPlacement else { return true }
        let a = stored.placement, b = request.placement
        return a.kind == b.kind && a.anchor.column == b.anchor.column && a.anchor.row == b.anchor.row && a.quarterTurns == b.quarterTurns
    }

    // MARK: Quit (E 4.5)

    public func quitMatch(request: Matchmaking_V1_QuitMatchRequest, context: ServerContext) async throws -> Matchmaking_V1_QuitMatchResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        try errors.throwIfAny()
        let now = core.now(), configuration = core.configuration, hub = core.hub
        var r = Matchmaking_V1_QuitMatchResponse()
        r.match = try await core.write { tx, effects in
            var m = try Self.playerMatch(tx, id, caller.userID)
            try MatchStore.expireTurnIfDue(tx, &m, now: now, configuration: configuration, effects: &effects)
            guard m.isActive else {
                // A retried quit answers with the match it ended.
                if m.outcome?.reason == .quit, m.isLocal || m.outcome?.loserByForfeit == m.seat(of: caller.userID)?.proto {
                    return try MatchStore.proto(tx, m, hub: hub)
                }
                throw RPCError(.failedPrecondition, "the match is already over")
            }
            if m.isLocal {
                try MatchStore.finish(tx, &m, winner: nil, reason: .quit, forfeit: nil, now: now, configuration: configuration, effects: &effects)
            } else {
                let seat = m.seat(of: caller.userID)!
                try MatchStore.finish(
                    tx, &m, winner: seat.other, reason: .quit, forfeit: seat, now: now, configuration: configuration, effects: &effects)
            }
            try m.save(tx)
            return try MatchStore.proto(tx, m, hub: hub)
        }
        return r
    }

    // MARK: Rematch (E 4.4)

    public func requestRematch(
        request: Matchmaking_V1_RequestRematchRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_RequestRematchResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        try errors.throwIfAny()
        let now = core.now(), newID = ULID.make(now: now), configuration = core.configuration, hub = core.hub
        return try await core.write { tx, effects in
            var m = try Self.playerMatch(tx, id, caller.userID)
            try MatchStore.expireTurnIfDue(tx, &m, now: now, configuration: configuration, effects: &effects)
            try MatchStore.closeWindowIfDue(tx, &m, now: now, effects: &effects)
            var r = Matchmaking_V1_RequestRematchResponse()
            if m.rematchState == .started, let next = try MatchRecord.load(tx, m.rematchID) {
                r.state = .started
                r.newMatch = try MatchStore.proto(tx, next, hub: hub)
                return r
            }
            guard !m.isActive else { throw RPCError(.failedPrecondition, "the match is still being played") }
            guard m.rematchState != .declined, m.windowOpen(now: now), !m.players.contains("") else {
                throw RPCError(.failedPrecondition, "no rematch is possible any more (declined, or the 2-minute window closed)")
            }
            let users = try UserNames.refs(tx, ids: m.players)
            let seat = m.seat(of: caller.userID)!
            if m.isLocal || m.rematchRequested[seat.other.index] {
                // Both agree: the new match, seats swapped, rated like this one.
                let players = [m.players[1], m.players[0]]
                let kind: Matchmaking_V1_MatchKind = m.isLocal ? .local : .rematch
                let b = m.board
                let next = try MatchStore.create(
                    tx, id: newID, kind: kind, rated: m.rated, players: players, caller: caller.userID, columns: Int(b.columns),
                    rows: Int(b.rows), rematchOf: m.id, now: now, configuration: configuration, effects: &effects)
                m.rematchRequested[seat.index] = true
                m.rematchState = .started
                m.rematchID = newID
                m.windowClosesAt = nil
                try MatchStore.appendRematch(tx, &m, .started, by: seat, newMatchID: newID, now: now, effects: &effects)
                try m.save(tx)
                r.state = .started
                r.newMatch = MatchStore.proto(next, users: users, hub: hub)  // the same players, seats swapped
                return r
            }
            if !m.rematchRequested[seat.index] {
                m.rematchRequested[seat.index] = true
                m.rematchState = .waiting
                try MatchStore.appendRematch(tx, &m, .waiting, by: seat, now: now, effects: &effects)
                try m.save(tx)
                try Notify.send(
                    tx, eventID: "matchmaking:rematch-request:\(m.id):\(seat.rawValue)", to: [m.players[seat.other.index]],
                    kind: .rematchRequest, title: "\(Names.name(MatchRecord.ref(caller.userID, users))) wants a rematch", actor: caller.userID,
                    matchID: m.id)
            }
            r.state = .waiting
            return r
        }
    }

    public func declineRematch(
        request: Matchmaking_V1_DeclineRematchRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_DeclineRematchResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        try errors.throwIfAny()
        let now = core.now(), configuration = core.configuration
        try await core.write { tx, effects in
            var m = try Self.playerMatch(tx, id, caller.userID)
            try MatchStore.expireTurnIfDue(tx, &m, now: now, configuration: configuration, effects: &effects)
            guard !m.isActive else { throw RPCError(.failedPrecondition, "the match is still being played") }
            if m.rematchState == .declined { return }  // idempotent
            if m.rematchState == .started { throw RPCError(.failedPrecondition, "the rematch has already started") }
            let seat = m.seat(of: caller.userID)!
            m.rematchState = .declined
            m.windowClosesAt = nil
            try MatchStore.appendRematch(tx, &m, .declined, by: seat, now: now, effects: &effects)
            try m.save(tx)
        }
        return Matchmaking_V1_DeclineRematchResponse()
    }

    // MARK: Review and replay (E 4.7, 4.8)

    public func listMatchMoves(
        request: Matchmaking_V1_ListMatchMovesRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_ListMatchMovesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        let size = FieldRules.pageSize(request.pageSize, defaultSize: 200, maximum: 200, into: &errors)  // the contract: 1..200, 0 = 200
        let cursor = core.pageTokens.cursor(request.pageToken, filters: "moves:\(id)", parts: 1, into: &errors)
        try errors.throwIfAny()
        let after = Int(cursor?.first ?? "0") ?? 0
        let moves = try await core.store.read { c in
            let m = try Self.playerMatch(c, id, caller.userID)
            return try MatchStore.moves(c, m, users: try UserNames.refs(c, ids: m.players), after: after, limit: size + 1)
        }
        var r = Matchmaking_V1_ListMatchMovesResponse()
        r.moves = Array(moves.prefix(size))
        if moves.count > size, let last = r.moves.last {
            r.nextPageToken = core.pageTokens.make(cursor: [String(last.turnNumber)], filters: "moves:\(id)")
        }
        return r
    }

    public func getMatchReplay(
        request: Matchmaking_V1_GetMatchReplayRequest, context: ServerContext
    ) async throws -> Matchmaking_V1_GetMatchReplayResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        try errors.throwIfAny()
        let hub = core.hub
        return try await core.store.read { c in
            let m = try Self.playerMatch(c, id, caller.userID)
            guard !m.isActive else {
                throw RPCError(.failedPrecondition, "the match is still being played: review its moves with ListMatchMoves")
            }
            let users = try UserNames.refs(c, ids: m.players)
            var r = Matchmaking_V1_GetMatchReplayResponse()
            r.match = MatchStore.proto(m, users: users, hub: hub)
            r.initialBoard = MatchRecord.board(GameState(columns: Int(m.board.columns), rows: Int(m.board.rows)))
            r.moves = try MatchStore.moves(c, m, users: users)
            let played = r.moves.map { Int($0.turnNumber) }.max() ?? 0
            r.dealtShapes = played > 0 ? (1...played).map { m.dealt(turn: $0).proto } : []
            return r
        }
    }
}
