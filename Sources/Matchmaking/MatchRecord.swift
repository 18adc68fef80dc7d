import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

typealias Match = Matchmaking_V1_Match
typealias Seat = Matchmaking_V1_Seat

/// One `matches` row, decoded. Handlers change it and `save` it inside their transaction.
struct MatchRecord: Sendable {
    var id: String
    var kind: Matchmaking_V1_MatchKind
    var status: Matchmaking_V1_MatchStatus
    var rated: Bool
    /// User ids: index 0 FIRST, 1 SECOND ('' once erased).
    var players: [String]
    var ratingBefore: [Double]
    var seed: UInt64
    var board: Matchmaking_V1_Board
    var turnNumber: Int
    var turnStartedAt: Int64
    var turnDeadline: Int64?
    var outcome: Matchmaking_V1_MatchOutcome?
    var rematchState: Matchmaking_V1_RematchState
    var rematchRequested: [Bool]
    var rematchOf: String
    var rematchID: String
    var windowClosesAt: Int64?
    var startedAt: Int64
    var finishedAt: Int64?
    var lastSequence: Int64

    static let columns =
        "id, kind, status, rated, first_id, second_id, first_rating_before, second_rating_before, seed, board, turn_number, turn_started_at, turn_deadline, outcome, rematch_state, first_rematch, second_rematch, rematch_of, rematch_id, window_closes_at, started_at, finished_at, last_sequence"

    init(row: Row) throws {
        id = try row.get("id")
        kind = Matchmaking_V1_MatchKind(rawValue: Int32(try row.get("kind", as: Int.self)))
        status = Matchmaking_V1_MatchStatus(rawValue: Int32(try row.get("status", as: Int.self)))
        rated = try row.get("rated")
        players = [try row.get("first_id"), try row.get("second_id")]
        ratingBefore = [try row.get("first_rating_before"), try row.get("second_rating_before")]
        seed = UInt64(bitPattern: try row.get("seed", as: Int64.self))
        board = try Matchmaking_V1_Board(serializedBytes: try row.get("board", as: [UInt8].self))
        turnNumber = try row.get("turn_number")
        turnStartedAt = try row.get("turn_started_at")
        turnDeadline = try row.get("turn_deadline")
        if let bytes = try row.get("outcome", as: [UInt8]?.self) { outcome = try Matchmaking_V1_MatchOutcome(serializedBytes: bytes) }
        rematchState = Matchmaking_V1_RematchState(rawValue: Int32(try row.get("rematch_state", as: Int.self)))
        rematchRequested = [try row.get("first_rematch"), try row.get("second_rematch")]
        rematchOf = try row.get("rematch_of")
        rematchID = try row.get("rematch_id")
        windowClosesAt = try row.get("window_closes_at")
        startedAt = try row.get("started_at")
        finishedAt = try row.get("finished_at")
        lastSequence = try row.get("last_sequence")
    }

    init(
        id: String, kind: Matchmaking_V1_MatchKind, rated: Bool, players: [String], ratingBefore: [Double], seed: UInt64,
        columns: Int, rows: Int, now: Int64, deadline: Int64?, rematchOf: String
    ) {
        self.id = id
        self.kind = kind
        status = .active
        self.rated = rated
        self.players = players
        self.ratingBefore = ratingBefore
        self.seed = seed
        board = Self.board(GameState(columns: columns, rows: rows))
        turnNumber = 1
        turnStartedAt = now
        turnDeadline = deadline
        rematchState = .unspecified
        rematchRequested = [false, false]
        self.rematchOf = rematchOf
        rematchID = ""
        startedAt = now
        lastSequence = 0
    }

    static func load(_ db: some SQLReader, _ id: String) throws -> MatchRecord? {
        try db.queryOne("SELECT \(columns) FROM matches WHERE id = ?", id).map(MatchRecord.init(row:))
    }

    func insert(_ tx: Transaction) throws {
        try tx.execute(
            "INSERT INTO matches (\(Self.columns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            id, Int(kind.rawValue), Int(status.rawValue), rated, players[0], players[1], ratingBefore[0], ratingBefore[1],
            Int64(bitPattern: seed), board.serializedBytes(), turnNumber, turnStartedAt, turnDeadline, outcome?.serializedBytes(),
            Int(rematchState.rawValue), rematchRequested[0], rematchRequested[1], rematchOf, rematchID, windowClosesAt, startedAt,
            finishedAt, lastSequence)
    }

    func save(_ tx: Transaction) throws {
        try tx.execute(
            """
            UPDATE matches SET status = ?, board = ?, turn_number = ?, turn_started_at = ?, turn_deadline = ?, outcome = ?,
                rematch_state = ?, first_rematch = ?, second_rematch = ?, rematch_id = ?, window_closes_at = ?, finished_at = ?,
                last_sequence = ?
            WHERE id = ?
            """,
            Int(status.rawValue), board.serializedBytes(), turnNumber, turnStartedAt, turnDeadline, outcome?.serializedBytes(),
            Int(rematchState.rawValue), rematchRequested[0], rematchRequested[1], rematchID, windowClosesAt, finishedAt,
            lastSequence, id)
    }

    var isLocal: Bool { kind == .local }
    var isActive: Bool { status == .active }

    /// The seat `userID` plays (FIRST for the caller of a local match), nil for others.
    func seat(of userID: String) -> GameSeat? {
        if players[0] == userID { return .first }
        if players[1] == userID { return .second }
        return nil
    }

    /// Whether the rematch window (and chat after the end) is open at `now`.
    func windowOpen(now: Int64) -> Bool { !isActive && (windowClosesAt.map { now < $0 } ?? false) }

    /// The rules' state of the board.
    var game: GameState {
        let shapes = board.shapes.map { s in
            PlacedShape(
                shape: Shape(rawValue: Int(s.kind.rawValue)) ?? .monomino, anchor: Point(Int(s.anchor.column), Int(s.anchor.row)),
                quarterTurns: Int(s.quarterTurns), cells: s.cells.map { Point(Int($0.column), Int($0.row)) },
                seat: s.placedBy == .second ? .second : .first, turn: Int(s.turnNumber))
        }
        return GameState(
            columns: Int(board.columns), rows: Int(board.rows), shapes: shapes,
            avatars: [
                Point(Int(board.firstAvatar.column), Int(board.firstAvatar.row)), Point(Int(board.secondAvatar.column), Int(board.secondAvatar.row)),
            ],
            turn: turnNumber)
    }

    static func board(_ g: GameState) -> Matchmaking_V1_Board {
        var b = Matchmaking_V1_Board()
        b.columns = Int32(g.columns)
        b.rows = Int32(g.rows)
        b.shapes = g.shapes.map(placement)
        b.firstAvatar = cell(g.avatars[0])
        b.secondAvatar = cell(g.avatars[1])
        return b
    }

    static func cell(_ p: Point) -> Matchmaking_V1_Cell {
        var c = Matchmaking_V1_Cell()
        c.column = Int32(p.column)
        c.row = Int32(p.row)
        return c
    }

    static func placement(_ s: PlacedShape) -> Matchmaking_V1_ShapePlacement {
        var p = Matchmaking_V1_ShapePlacement()
        p.kind = Matchmaking_V1_ShapeKind(rawValue: Int32(s.shape.rawValue))
        p.anchor = cell(s.anchor)
        p.quarterTurns = Int32(s.quarterTurns)
        p.cells = s.cells.map(cell)
        p.placedBy = s.seat.proto
        p.turnNumber = Int32(s.turn)
        return p
    }

    func dealt(turn: Int) -> Shape { ShapeDealer.shape(seed: seed, turn: turn) }

    /// The match as the contract shows it. `users` names the players; `connected` says who
    /// watches now.
    func proto(users: [String: Common_V1_UserRef], connected: [Bool]) -> Match {
        var m = Match()
        m.matchId = id
        m.kind = kind
        m.status = status
        m.rated = rated
        for seat in GameSeat.allCases {
            var p = Matchmaking_V1_MatchPlayer()
            p.user = Self.ref(players[seat.index], users)
            p.seat = seat.proto
            p.ratingBefore = ratingBefore[seat.index]
            p.rematchRequested = rematchRequested[seat.index]
            p.connected = connected[seat.index]
            if seat == .first { m.first = p } else { m.second = p }
        }
        m.board = board
        m.turnNumber = Int32(turnNumber)
        if isActive {
            m.seatToMove = GameSeat.toMove(turn: turnNumber).proto
            m.nextShape = dealt(turn: turnNumber).proto
            m.shapeAfterNext = dealt(turn: turnNumber + 1).proto
            if let d = turnDeadline { m.turnDeadline = Google_Protobuf_Timestamp(milliseconds: d) }
        }
        if let outcome { m.outcome = outcome }
        m.rematchState = rematchState
        m.rematchOfMatchId = rematchOf
        m.rematchMatchId = rematchID
        m.startedAt = Google_Protobuf_Timestamp(milliseconds: startedAt)
        if let f = finishedAt { m.finishedAt = Google_Protobuf_Timestamp(milliseconds: f) }
        return m
    }

    /// A player's public reference: the cached names, only the id when unknown, "Deleted player"
    /// once erased.
    static func ref(_ id: String, _ users: [String: Common_V1_UserRef]) -> Common_V1_UserRef {
        if id.isEmpty {
            var r = Common_V1_UserRef()
            r.displayName = "Deleted player"
            return r
        }
        if let r = users[id] { return r }
        var r = Common_V1_UserRef()
        r.userId = id
        return r
    }
}

extension GameSeat {
    var proto: Seat { self == .first ? .first : .second }
    init?(_ seat: Seat) {
        switch seat {
        case .first: self = .first
        case .second: self = .second
        default: return nil
        }
    }
}

extension Shape {
    var proto: Matchmaking_V1_ShapeKind { Matchmaking_V1_ShapeKind(rawValue: Int32(rawValue)) }
}

/// The public names the store keeps (`users`).
enum UserNames {
    static func refs(_ db: some SQLReader, ids: [String]) throws -> [String: Common_V1_UserRef] {
        var out: [String: Common_V1_UserRef] = [:]
        for id in Set(ids) where !id.isEmpty {
            if let row = try db.queryOne("SELECT id, username, display_name FROM users WHERE id = ?", id) {
                var r = Common_V1_UserRef()
                r.userId = try row.get("id")
                r.username = try row.get("username")
                r.displayName = try row.get("display_name")
                out[id] = r
            }
        }
        return out
    }
}
