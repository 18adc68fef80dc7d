/// The board game's rules (the GAME RULES at the top of `Proto/matchmaking/v1/matchmaking.proto`)
/// as pure value types and functions: no storage, no clock, no proto types. The service converts
/// requests to `MoveInput`, asks `GameRules.validate`, and stores what `GameState.applying`
/// returns; tests drive the same functions directly (tables of tricky positions, thousands of
/// random games).

/// A board cell, 0-based (column left to right, row from FIRST's home row).
public struct Point: Hashable, Sendable, CustomStringConvertible {
    public var column: Int
    public var row: Int
    public init(_ column: Int, _ row: Int) {
        self.column = column
        self.row = row
    }
    public var description: String { "(\(column), \(row))" }
}

/// The two sides. FIRST moves on odd turns and starts on row 0; SECOND on even turns, row rows-1.
public enum GameSeat: Int, Sendable, CaseIterable {
    case first = 1
    case second = 2

    public var other: GameSeat { self == .first ? .second : .first }
    /// Index into per-seat arrays.
    public var index: Int { rawValue - 1 }
    /// The seat that plays turn `turn` (1-based).
    public static func toMove(turn: Int) -> GameSeat { turn % 2 == 1 ? .first : .second }
    public var name: String { self == .first ? "FIRST" : "SECOND" }
}

/// One avatar step in board coordinates (raw values as in the contract's `Direction`).
public enum Step: Int, Sendable, CaseIterable {
    case up = 1, down = 2, left = 3, right = 4

    public var delta: (dc: Int, dr: Int) {
        switch self {
        case .up: (0, 1)
        case .down: (0, -1)
        case .left: (-1, 0)
        case .right: (1, 0)
        }
    }
}

/// The polyomino kinds (raw values as in the contract's `ShapeKind`).
public enum Shape: Int, Sendable, CaseIterable {
    case monomino = 1, domino, trominoI, trominoL, tetrominoI, tetrominoO, tetrominoT, tetrominoL, tetrominoJ, tetrominoS, tetrominoZ

    /// Offsets (column, row) before rotation, exactly as the contract lists them.
    public var offsets: [Point] {
        switch self {
        case .monomino: [Point(0, 0)]
        case .domino: [Point(0, 0), Point(1, 0)]
        case .trominoI: [Point(0, 0), Point(1, 0), Point(2, 0)]
        case .trominoL: [Point(0, 0), Point(0, 1), Point(1, 0)]
        case .tetrominoI: [Point(0, 0), Point(1, 0), Point(2, 0), Point(3, 0)]
        case .tetrominoO: [Point(0, 0), Point(1, 0), Point(0, 1), Point(1, 1)]
        case .tetrominoT: [Point(0, 0), Point(1, 0), Point(2, 0), Point(1, 1)]
        case .tetrominoL: [Point(0, 0), Point(0, 1), Point(0, 2), Point(1, 0)]
        case .tetrominoJ: [Point(0, 0), Point(1, 0), Point(1, 1), Point(1, 2)]
        case .tetrominoS: [Point(0, 0), Point(1, 0), Point(1, 1), Point(2, 1)]
        case .tetrominoZ: [Point(1, 0), Point(2, 0), Point(0, 1), Point(1, 1)]
        }
    }

    /// The offsets turned `quarterTurns` times by (dc, dr) → (dr, −dc), then shifted so the
    /// smallest column and row are 0 (in the order of `offsets`).
    public func turned(_ quarterTurns: Int) -> [Point] {
        Self.turnedTable[rawValue - 1][((quarterTurns % 4) + 4) % 4]
    }

    private static let turnedTable: [[[Point]]] = allCases.map { shape in
        (0..<4).map { q in
            var cells = shape.offsets
            for _ in 0..<q { cells = cells.map { Point($0.row, -$0.column) } }
            let minC = cells.map(\.column).min()!, minR = cells.map(\.row).min()!
            return cells.map { Point($0.column - minC, $0.row - minR) }
        }
    }
}

/// A shape on the board.
public struct PlacedShape: Sendable, Equatable {
    public var shape: Shape
    public var anchor: Point
    public var quarterTurns: Int
    public var cells: [Point]
    public var seat: GameSeat
    public var turn: Int
    public init(shape: Shape, anchor: Point, quarterTurns: Int, cells: [Point], seat: GameSeat, turn: Int) {
        self.shape = shape
        self.anchor = anchor
        self.quarterTurns = quarterTurns
        self.cells = cells
        self.seat = seat
        self.turn = turn
    }
}

/// The state of a match between turns.
public struct GameState: Sendable, Equatable {
    public static let defaultSize = 9
    public static let sizeRange = 5...15
    /// Turns per seat before TURN_LIMIT.
    public static let turnsPerSeat = 100
    public static let maxSteps = 3

    public let columns: Int
    public let rows: Int
    /// Cells holding a shape (row-major, `row * columns + column`).
    public private(set) var blocked: [Bool]
    /// Avatars: index 0 FIRST, 1 SECOND.
    public private(set) var avatars: [Point]
    /// Next turn to play, 1-based.
    public private(set) var turn: Int
    public private(set) var shapes: [PlacedShape]

    /// The start of a match: avatars at (columns/2, 0) and (columns/2, rows-1), no shapes.
    public init(columns: Int, rows: Int) {
        precondition(Self.sizeRange.contains(columns) && Self.sizeRange.contains(rows), "board size out of range")
        self.columns = columns
        self.rows = rows
        blocked = Array(repeating: false, count: columns * rows)
        avatars = [Point(columns / 2, 0), Point(columns / 2, rows - 1)]
        turn = 1
        shapes = []
    }

    /// A state rebuilt from stored parts (the service keeps the board; tests build positions).
    public init(columns: Int, rows: Int, shapes: [PlacedShape], avatars: [Point], turn: Int) {
        self.init(columns: columns, rows: rows)
        for s in shapes { for c in s.cells where contains(c) { blocked[index(c)] = true } }
        self.shapes = shapes
        self.avatars = avatars
        self.turn = turn
    }

    public var seatToMove: GameSeat { GameSeat.toMove(turn: turn) }
    public func avatar(_ seat: GameSeat) -> Point { avatars[seat.index] }
    /// Goal row of a seat: FIRST aims for rows-1, SECOND for 0.
    public func goalRow(_ seat: GameSeat) -> Int { seat == .first ? rows - 1 : 0 }
    public func contains(_ p: Point) -> Bool { p.column >= 0 && p.column < columns && p.row >= 0 && p.row < rows }
    @inline(__always) func index(_ p: Point) -> Int { p.row * columns + p.column }
    public func isBlocked(_ p: Point) -> Bool { blocked[index(p)] }

    /// Length of the shortest orthogonal path over cells without shapes from `seat`'s avatar to
    /// its goal row, ignoring the other avatar (0 when on it); nil when there is none.
    public func shortestPath(_ seat: GameSeat) -> Int? {
        GameRules.distanceToRow(blocked: blocked, columns: columns, rows: rows, from: avatar(seat), goalRow: goalRow(seat))
    }

    /// Plays a move already validated by `GameRules.validate` (the service never applies
    /// anything else).
    public func applying(_ move: ValidatedMove) -> GameState {
        var next = self
        if let p = move.placement {
            for c in p.cells { next.blocked[index(c)] = true }
            next.shapes.append(p)
        }
        if let last = move.path.last { next.avatars[move.seat.index] = last }
        next.turn += 1
        return next
    }

    /// Whether the match is over after the last move: the mover reached their goal row, or the
    /// last turn of the limit was played.
    public var isTurnLimitReached: Bool { turn > 2 * Self.turnsPerSeat }
}
