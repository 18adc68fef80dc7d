/// A move as a client sent it, before validation: raw enum numbers, an optional anchor, so every
/// malformed request can be named field by field.
public struct MoveInput: Sendable, Equatable {
    public struct Placement: Sendable, Equatable {
        /// `ShapeKind` number (must equal the dealt shape).
        public var kind: Int
        /// Unset in the request → nil.
        public var anchor: Point?
        public var quarterTurns: Int
        public init(kind: Int, anchor: Point?, quarterTurns: Int) {
            self.kind = kind
            self.anchor = anchor
            self.quarterTurns = quarterTurns
        }
    }
    public var placement: Placement?
    /// `Direction` numbers.
    public var steps: [Int]
    public init(placement: Placement?, steps: [Int]) {
        self.placement = placement
        self.steps = steps
    }
}

/// A legal move with what the server fills in: the placed cells and the path walked.
public struct ValidatedMove: Sendable, Equatable {
    public var seat: GameSeat
    public var turn: Int
    public var placement: PlacedShape?
    public var steps: [Step]
    /// Cell reached after each step.
    public var path: [Point]
    /// The last step reached the goal row (the mover wins).
    public var reachedGoal: Bool
}

/// Why a move was refused: one entry per field, with the contract's field paths
/// ("placement.anchor", "steps[2]", ...).
public struct MoveRejection: Error, Sendable, Equatable {
    public var violations: [Violation]
    public struct Violation: Sendable, Equatable {
        public var field: String
        public var description: String
    }
    init(_ v: [Violation]) { violations = v }
    public var fields: [String] { violations.map(\.field) }
}

/// How a match ended, from the board alone (quits and timeouts are decided by the service).
public enum BoardOutcome: Sendable, Equatable {
    case goalReached(winner: GameSeat)
    /// After 100 turns per seat: the shorter shortest path wins; nil = a draw.
    case turnLimit(winner: GameSeat?)
}

public enum GameRules {
    /// The cells a placement would cover, or nil when a cell leaves the board.
    public static func cells(of shape: Shape, anchor: Point, quarterTurns: Int, in state: GameState) -> [Point]? {
        let cells = shape.turned(quarterTurns).map { Point($0.column + anchor.column, $0.row + anchor.row) }
        return cells.allSatisfy(state.contains) ? cells : nil
    }

    /// Why `cells` cannot take a shape now (a shape or an avatar there, or a path cut), or nil
    /// when the placement is legal. `cells` are on the board.
    public static func placementProblem(_ cells: [Point], in state: GameState) -> String? {
        for c in cells {
            if state.isBlocked(c) { return "cell \(c) already holds a shape" }
            if c == state.avatars[0] { return "cell \(c) holds FIRST's avatar" }
            if c == state.avatars[1] { return "cell \(c) holds SECOND's avatar" }
        }
        var blocked = state.blocked
        for c in cells { blocked[state.index(c)] = true }
        for seat in GameSeat.allCases
        where distanceToRow(blocked: blocked, columns: state.columns, rows: state.rows, from: state.avatar(seat), goalRow: state.goalRow(seat))
            == nil
        {
            return "it would leave \(seat.name)'s avatar no path to its goal row"
        }
        return nil
    }

    /// A legal position of `shape` (the first in anchor-row, anchor-column, quarter-turn order), or
    /// nil when it has none: the only case where a placement may be omitted.
    public static func anyLegalPlacement(of shape: Shape, in state: GameState) -> (anchor: Point, quarterTurns: Int)? {
        var seen: [[Point]] = []
        for q in 0..<4 {
            let offsets = shape.turned(q)
            if seen.contains(where: { Set($0) == Set(offsets) }) { continue }
            seen.append(offsets)
            let w = offsets.map(\.column).max()! + 1, h = offsets.map(\.row).max()! + 1
            guard w <= state.columns, h <= state.rows else { continue }
            for r in 0...(state.rows - h) {
                for c in 0...(state.columns - w) {
                    let cells = offsets.map { Point($0.column + c, $0.row + r) }
                    if placementProblem(cells, in: state) == nil { return (Point(c, r), q) }
                }
            }
        }
        return nil
    }

    /// Validates the move of the seat to move, with `dealt` the shape dealt for this turn.
    /// Every bad field is named; step problems are checked on the board after a valid placement.
    public static func validate(_ input: MoveInput, dealt: Shape, in state: GameState) -> Result<ValidatedMove, MoveRejection> {
        var violations: [MoveRejection.Violation] = []
        func bad(_ field: String, _ text: String) { violations.append(.init(field: field, description: text)) }
        let seat = state.seatToMove
        var board = state
        var placed: PlacedShape?

        if let p = input.placement {
            var ok = true
            if p.kind != dealt.rawValue {
                bad("placement.kind", "must be the dealt shape (\(dealt.protoName)), as Match.next_shape says")
                ok = false
            }
            if !(0...3).contains(p.quarterTurns) {
                bad("placement.quarter_turns", "must be 0 to 3")
                ok = false
            }
            if let anchor = p.anchor {
                if ok {
                    if let cells = cells(of: dealt, anchor: anchor, quarterTurns: p.quarterTurns, in: state) {
                        if let problem = placementProblem(cells, in: state) {
                            bad("placement.anchor", "the shape cannot go at \(anchor): \(problem)")
                        } else {
                            let shape = PlacedShape(
                                shape: dealt, anchor: anchor, quarterTurns: p.quarterTurns, cells: cells, seat: seat, turn: state.turn)
                            placed = shape
                            board = state.applying(
                                ValidatedMove(seat: seat, turn: state.turn, placement: shape, steps: [], path: [], reachedGoal: false))
                        }
                    } else {
                        bad("placement.anchor", "the shape would leave the \(state.columns) × \(state.rows) board at \(anchor)")
                    }
                }
            } else {
                bad("placement.anchor", "required")
            }
        } else if let legal = anyLegalPlacement(of: dealt, in: state) {
            bad(
                "placement",
                "required: the dealt shape (\(dealt.protoName)) has a legal position, e.g. anchor \(legal.anchor) with quarter_turns \(legal.quarterTurns)"
            )
        }

        if input.steps.count > GameState.maxSteps {
            bad("steps", "at most \(GameState.maxSteps) steps, got \(input.steps.count)")
        }
        var steps: [Step] = []
        for (i, raw) in input.steps.prefix(GameState.maxSteps).enumerated() {
            guard let s = Step(rawValue: raw) else {
                bad("steps[\(i)]", "must be UP, DOWN, LEFT or RIGHT")
                continue
            }
            steps.append(s)
        }
        guard violations.isEmpty else { return .failure(MoveRejection(violations)) }

        // Steps on the board after the placement.
        var at = board.avatar(seat)
        let opponent = board.avatar(seat.other)
        let goal = board.goalRow(seat)
        var path: [Point] = []
        var reached = false
        for (i, s) in steps.enumerated() {
            if reached {
                bad("steps[\(i)]", "the goal row was reached at step \(i - 1): it ends the move")
                break
            }
            let next = Point(at.column + s.delta.dc, at.row + s.delta.dr)
            if !board.contains(next) {
                bad("steps[\(i)]", "\(s.name) from \(at) leaves the board")
                break
            }
            if board.isBlocked(next) {
                bad("steps[\(i)]", "\(s.name) from \(at) enters \(next), which holds a shape")
                break
            }
            if next == opponent {
                bad("steps[\(i)]", "\(s.name) from \(at) enters \(next), the opponent's avatar")
                break
            }
            at = next
            path.append(next)
            if next.row == goal { reached = true }
        }
        guard violations.isEmpty else { return .failure(MoveRejection(violations)) }
        return .success(ValidatedMove(seat: seat, turn: state.turn, placement: placed, steps: steps, path: path, reachedGoal: reached))
    }

    /// The outcome after `move` took `before` to `after`, or nil when play goes on.
    public static func outcome(after move: ValidatedMove, state after: GameState) -> BoardOutcome? {
        if move.reachedGoal { return .goalReached(winner: move.seat) }
        guard after.isTurnLimitReached else { return nil }
        let first = after.shortestPath(.first) ?? Int.max, second = after.shortestPath(.second) ?? Int.max
        if first == second { return .turnLimit(winner: nil) }
        return .turnLimit(winner: first < second ? .first : .second)
    }

    /// Breadth-first distance from `from` to any cell of `goalRow` over unblocked cells.
    public static func distanceToRow(blocked: [Bool], columns: Int, rows: Int, from: Point, goalRow: Int) -> Int? {
        if from.row == goalRow { return 0 }
        let n = columns * rows
        return withUnsafeTemporaryAllocation(of: Int32.self, capacity: n * 2) { buffer -> Int? in
            // dist[i] (−1 = unseen) in the first half, the queue in the second.
            let dist = UnsafeMutableBufferPointer(rebasing: buffer[0..<n])
            let queue = UnsafeMutableBufferPointer(rebasing: buffer[n..<(2 * n)])
            dist.initialize(repeating: -1)
            var head = 0, tail = 0
            let start = from.row * columns + from.column
            dist[start] = 0
            queue[tail] = Int32(start)
            tail += 1
            while head < tail {
                let i = Int(queue[head])
                head += 1
                let r = i / columns, c = i - r * columns
                let d = dist[i] + 1
                // Up, down, left, right.
                for k in 0..<4 {
                    let nr = k == 0 ? r + 1 : k == 1 ? r - 1 : r
                    let nc = k == 2 ? c - 1 : k == 3 ? c + 1 : c
                    if nr < 0 || nr >= rows || nc < 0 || nc >= columns { continue }
                    let j = nr * columns + nc
                    if blocked[j] || dist[j] >= 0 { continue }
                    if nr == goalRow { return Int(d) }
                    dist[j] = d
                    queue[tail] = Int32(j)
                    tail += 1
                }
            }
            return nil
        }
    }
}

extension Shape {
    /// The contract's name (`SHAPE_KIND_TETROMINO_T`).
    public var protoName: String {
        switch self {
        case .monomino: "SHAPE_KIND_MONOMINO"
        case .domino: "SHAPE_KIND_DOMINO"
        case .trominoI: "SHAPE_KIND_TROMINO_I"
        case .trominoL: "SHAPE_KIND_TROMINO_L"
        case .tetrominoI: "SHAPE_KIND_TETROMINO_I"
        case .tetrominoO: "SHAPE_KIND_TETROMINO_O"
        case .tetrominoT: "SHAPE_KIND_TETROMINO_T"
        case .tetrominoL: "SHAPE_KIND_TETROMINO_L"
        case .tetrominoJ: "SHAPE_KIND_TETROMINO_J"
        case .tetrominoS: "SHAPE_KIND_TETROMINO_S"
        case .tetrominoZ: "SHAPE_KIND_TETROMINO_Z"
        }
    }
}

extension Step {
    public var name: String {
        switch self {
        case .up: "UP"
        case .down: "DOWN"
        case .left: "LEFT"
        case .right: "RIGHT"
        }
    }
}

/// The dealt-shape sequence of a match: a pure function of the match's seed and the turn, so a
/// replay (or anyone holding the seed) reproduces every dealt shape, and the next two are known.
public enum ShapeDealer {
    public static func shape(seed: UInt64, turn: Int) -> Shape {
        // SplitMix64 of (seed, turn): independent per turn, uniform over the 11 kinds.
        var z = seed &+ UInt64(truncatingIfNeeded: turn) &* 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return Shape(rawValue: Int(z % UInt64(Shape.allCases.count)) + 1)!
    }
}
