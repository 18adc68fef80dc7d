import Foundation
import Testing

@testable import Matchmaking

/// A seeded pseudo-random generator (SplitMix64), so a failing game can be replayed by its seed.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// An independent reading of the GAME RULES (written from the contract's text, sharing nothing
/// with the engine but the shape offsets), used to judge the engine's verdict on random moves.
enum Oracle {
    static func cells(_ shape: Shape, anchor: Point, q: Int) -> [Point] {
        var cells = shape.offsets.map { ($0.column, $0.row) }
        for _ in 0..<q { cells = cells.map { ($0.1, -$0.0) } }
        let minC = cells.map(\.0).min()!, minR = cells.map(\.1).min()!
        return cells.map { Point($0.0 - minC + anchor.column, $0.1 - minR + anchor.row) }
    }

    static func hasPath(from: Point, goalRow: Int, blocked: Set<Point>, columns: Int, rows: Int) -> Bool {
        var seen: Set<Point> = [from]
        var frontier = [from]
        while let p = frontier.popLast() {
            if p.row == goalRow { return true }
            for (dc, dr) in [(0, 1), (0, -1), (1, 0), (-1, 0)] {
                let n = Point(p.column + dc, p.row + dr)
                guard n.column >= 0, n.column < columns, n.row >= 0, n.row < rows, !blocked.contains(n), !seen.contains(n) else { continue }
                seen.insert(n)
                frontier.append(n)
            }
        }
        return false
    }

    /// Whether the move is legal (placement given as kind/anchor/q; nil = omitted).
    static func isLegal(_ s: GameState, dealt: Shape, placement: (Int, Point, Int)?, steps: [Int]) -> Bool {
        let seat = s.seatToMove
        var blocked = Set(s.shapes.flatMap(\.cells))
        let goal = [s.rows - 1, 0]
        func pathsOK(_ b: Set<Point>) -> Bool {
            hasPath(from: s.avatars[0], goalRow: goal[0], blocked: b, columns: s.columns, rows: s.rows)
                && hasPath(from: s.avatars[1], goalRow: goal[1], blocked: b, columns: s.columns, rows: s.rows)
        }
        func fits(_ cells: [Point]) -> Bool {
            cells.allSatisfy { $0.column >= 0 && $0.column < s.columns && $0.row >= 0 && $0.row < s.rows && !blocked.contains($0) }
                && !cells.contains(s.avatars[0]) && !cells.contains(s.avatars[1]) && pathsOK(blocked.union(cells))
        }
        if let (kind, anchor, q) = placement {
            guard kind == dealt.rawValue, (0...3).contains(q) else { return false }
            let cells = cells(dealt, anchor: anchor, q: q)
            guard fits(cells) else { return false }
            blocked.formUnion(cells)
        } else {
            // Omitting is legal only when no position fits at all.
            for q in 0..<4 {
                for r in -3..<s.rows { for c in -3..<s.columns where fits(cells(dealt, anchor: Point(c, r), q: q)) { return false } }
            }
        }
        guard steps.count <= 3 else { return false }
        var at = s.avatars[seat.index]
        let other = s.avatars[seat.other.index]
        for (i, raw) in steps.enumerated() {
            if at.row == goal[seat.index] { return false }  // a step after reaching the goal
            let d: (Int, Int)
            switch raw {
            case 1: d = (0, 1)
            case 2: d = (0, -1)
            case 3: d = (-1, 0)
            case 4: d = (1, 0)
            default: return false
            }
            _ = i
            let n = Point(at.column + d.0, at.row + d.1)
            guard n.column >= 0, n.column < s.columns, n.row >= 0, n.row < s.rows, !blocked.contains(n), n != other else { return false }
            at = n
        }
        return true
    }
}

/// Thousands of random games through the rules engine: every move either legal by construction
/// or random (judged by the independent oracle), the invariants checked after every move, and
/// every illegal move refused.
@Suite("Matchmaking: random games")
struct RandomGamesTests {
    static func checkInvariants(_ s: GameState, previous: GameState, mover: GameSeat) {
        // Both avatars always have a path to their goal.
        #expect(s.shortestPath(.first) != nil, "FIRST has no path")
        #expect(s.shortestPath(.second) != nil, "SECOND has no path")
        // No overlap: shapes disjoint, avatars on free cells and apart.
        let cells = s.shapes.flatMap(\.cells)
        #expect(Set(cells).count == cells.count, "shapes overlap")
        #expect(!cells.contains(s.avatars[0]) && !cells.contains(s.avatars[1]), "an avatar stands on a shape")
        #expect(s.avatars[0] != s.avatars[1], "avatars overlap")
        // Turn order: one turn per move, seats alternate, only the mover moved.
        #expect(s.turn == previous.turn + 1)
        #expect(GameSeat.toMove(turn: previous.turn) == mover)
        #expect(s.avatars[mover.other.index] == previous.avatars[mover.other.index])
    }

    /// A random legal move: random positions tried first, then the first legal one; random
    /// legal steps (biased forwards so games end).
    static func legalMove(_ s: GameState, dealt: Shape, rng: inout SeededRandom) -> MoveInput {
        var placement: MoveInput.Placement?
        for _ in 0..<40 {
            let q = Int.random(in: 0..<4, using: &rng)
            let a = Point(Int.random(in: 0..<s.columns, using: &rng), Int.random(in: 0..<s.rows, using: &rng))
            if let cells = GameRules.cells(of: dealt, anchor: a, quarterTurns: q, in: s), GameRules.placementProblem(cells, in: s) == nil {
                placement = .init(kind: dealt.rawValue, anchor: a, quarterTurns: q)
                break
            }
        }
        if placement == nil, let legal = GameRules.anyLegalPlacement(of: dealt, in: s) {
            placement = .init(kind: dealt.rawValue, anchor: legal.anchor, quarterTurns: legal.quarterTurns)
        }
        var board = s
        if let p = placement, let v = try? GameRules.validate(MoveInput(placement: p, steps: []), dealt: dealt, in: s).get() {
            board = s.applying(v)
        }
        let seat = s.seatToMove
        var at = s.avatar(seat)
        let other = s.avatar(seat.other)
        var steps: [Int] = []
        let forward: Step = seat == .first ? .up : .down
        for _ in 0..<Int.random(in: 0...3, using: &rng) {
            if at.row == board.goalRow(seat) { break }
            let options = Step.allCases.filter { st in
                let n = Point(at.column + st.delta.dc, at.row + st.delta.dr)
                return board.contains(n) && !board.isBlocked(n) && n != other
            }
            guard !options.isEmpty else { break }
            let pick = options.contains(forward) && Int.random(in: 0..<10, using: &rng) > 1 ? forward : options.randomElement(using: &rng)!
            at = Point(at.column + pick.delta.dc, at.row + pick.delta.dr)
            steps.append(pick.rawValue)
        }
        return MoveInput(placement: placement, steps: steps)
    }

    /// A random, mostly illegal variation of a legal move.
    static func mutate(_ m: MoveInput, _ s: GameState, dealt: Shape, rng: inout SeededRandom) -> MoveInput {
        var m = m
        switch Int.random(in: 0..<7, using: &rng) {
        case 0: m.placement?.kind = Int.random(in: 0...12, using: &rng)
        case 1: m.placement?.anchor = Point(Int.random(in: -2...s.columns + 1, using: &rng), Int.random(in: -2...s.rows + 1, using: &rng))
        case 2: m.placement?.quarterTurns = Int.random(in: -1...5, using: &rng)
        case 3: m.placement = nil
        case 4: m.steps.append(Int.random(in: 0...5, using: &rng))
        case 5: m.steps = (0..<Int.random(in: 1...4, using: &rng)).map { _ in Int.random(in: 1...4, using: &rng) }
        default:
            // Onto a shape or an avatar.
            let targets = s.shapes.flatMap(\.cells) + s.avatars
            if let t = targets.randomElement(using: &rng) { m.placement?.anchor = t }
        }
        return m
    }

    /// 4 × 500 games (in parallel), each batch from its own seed.
    @Test(arguments: 0..<4) func thousandsOfRandomGamesKeepTheInvariants(batch: Int) {
        var rng = SeededRandom(seed: 20_261_124 &+ UInt64(batch) &* 7919)
        var games = 0, moves = 0, illegalRefused = 0, mutantsLegal = 0, goals = 0, limits = 0
        let sizes = [(9, 9), (5, 5), (15, 15), (7, 11)]
        while games < 500 {
            let (columns, rows) = sizes[games % sizes.count]
            let seed = rng.next()
            var s = GameState(columns: columns, rows: rows)
            var over = false
            while !over {
                let dealt = ShapeDealer.shape(seed: seed, turn: s.turn)
                // An illegal (or random) variation first: the engine's verdict must be the oracle's.
                let legal = Self.legalMove(s, dealt: dealt, rng: &rng)
                let mutant = Self.mutate(legal, s, dealt: dealt, rng: &rng)
                let oracle = Oracle.isLegal(
                    s, dealt: dealt, placement: mutant.placement.map { ($0.kind, $0.anchor ?? Point(-99, -99), $0.quarterTurns) },
                    steps: mutant.steps)
                let verdict = GameRules.validate(mutant, dealt: dealt, in: s)
                switch verdict {
                case .success: #expect(oracle, "engine accepted an illegal move \(mutant) at turn \(s.turn) (seed \(seed))")
                case .failure(let e):
                    #expect(!oracle, "engine refused a legal move \(mutant): \(e) (seed \(seed))")
                    #expect(!e.violations.isEmpty)
                    illegalRefused += 1
                }
                if oracle { mutantsLegal += 1 }

                // The legal move: accepted, and the invariants hold after it.
                guard case .success(let v) = GameRules.validate(legal, dealt: dealt, in: s) else {
                    Issue.record("engine refused a legal move \(legal) (seed \(seed))")
                    break
                }
                let next = s.applying(v)
                Self.checkInvariants(next, previous: s, mover: v.seat)
                moves += 1
                switch GameRules.outcome(after: v, state: next) {
                case .goalReached?:
                    goals += 1
                    over = true
                case .turnLimit?:
                    limits += 1
                    over = true
                case nil: break
                }
                s = next
            }
            games += 1
        }
        #expect(games == 500)
        #expect(illegalRefused > 250)
        #expect(goals + limits == games)
        print(
            "random games: \(games) games, \(moves) moves, \(illegalRefused) illegal moves refused, \(mutantsLegal) legal variations, \(goals) goals, \(limits) turn limits"
        )
    }
}
