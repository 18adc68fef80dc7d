import Foundation
import Testing

@testable import Matchmaking

/// The rules engine as pure functions: rotations, placement legality, the path check, steps, the
/// goal, the turn limit; a table of tricky positions; Glicko-2 against Glickman's worked example.
@Suite("Matchmaking: rules")
struct RulesTests {
    // MARK: Shapes

    @Test func rotationFollowsTheContractFormula() {
        // TROMINO_L (0,0) (0,1) (1,0): one quarter turn (dc, dr) → (dr, −dc) gives (0,0) (1,0) (0,−1),
        // shifted to (0,1) (1,1) (0,0).
        #expect(Set(Shape.trominoL.turned(1)) == [Point(0, 1), Point(1, 1), Point(0, 0)])
        // The I tetromino lies down then stands up.
        #expect(Set(Shape.tetrominoI.turned(1)) == [Point(0, 3), Point(0, 2), Point(0, 1), Point(0, 0)])
        #expect(Set(Shape.tetrominoI.turned(2)) == Set(Shape.tetrominoI.turned(0)))
        // O is the same every way; four turns are none.
        for q in 0..<4 { #expect(Set(Shape.tetrominoO.turned(q)) == Set(Shape.tetrominoO.offsets)) }
        for shape in Shape.allCases {
            #expect(Set(shape.turned(4)) == Set(shape.turned(0)))
            for q in 0..<4 {
                let cells = shape.turned(q)
                #expect(cells.count == shape.offsets.count)
                #expect(cells.map(\.column).min() == 0 && cells.map(\.row).min() == 0, "\(shape) q=\(q) not shifted to 0")
            }
        }
        // T pointing up (1,1 on top) turns to point right-down as the formula says.
        #expect(Set(Shape.tetrominoT.turned(1)) == [Point(0, 2), Point(0, 1), Point(0, 0), Point(1, 1)])
    }

    @Test func theDealtSequenceIsReproducibleFromTheSeed() {
        let a = (1...200).map { ShapeDealer.shape(seed: 42, turn: $0) }
        let b = (1...200).map { ShapeDealer.shape(seed: 42, turn: $0) }
        let c = (1...200).map { ShapeDealer.shape(seed: 43, turn: $0) }
        #expect(a == b)
        #expect(a != c)
        #expect(Set(a).count == Shape.allCases.count)  // every kind is dealt
    }

    // MARK: Placement

    func state(
        _ columns: Int = 9, _ rows: Int = 9, shapes: [(Shape, Point, Int)] = [], first: Point? = nil, second: Point? = nil, turn: Int = 1
    )
        -> GameState
    {
        var s = GameState(columns: columns, rows: rows)
        var placed: [PlacedShape] = []
        for (i, (shape, anchor, q)) in shapes.enumerated() {
            let cells = GameRules.cells(of: shape, anchor: anchor, quarterTurns: q, in: s)!
            placed.append(PlacedShape(shape: shape, anchor: anchor, quarterTurns: q, cells: cells, seat: i % 2 == 0 ? .first : .second, turn: i + 1))
        }
        s = GameState(
            columns: columns, rows: rows, shapes: placed, avatars: [first ?? Point(columns / 2, 0), second ?? Point(columns / 2, rows - 1)],
            turn: turn)
        return s
    }

    func move(_ kind: Shape?, _ anchor: Point?, _ q: Int = 0, _ steps: [Step] = []) -> MoveInput {
        MoveInput(placement: kind.map { .init(kind: $0.rawValue, anchor: anchor, quarterTurns: q) }, steps: steps.map(\.rawValue))
    }

    func fields(_ r: Result<ValidatedMove, MoveRejection>) -> [String] {
        if case .failure(let e) = r { return e.fields }
        return []
    }

    /// Tricky positions: each a board, the dealt shape, a move, and the fields refused ([] = legal).
    @Test func trickyPositions() {
        // A wall across row 4 with one gap at column 8 (two I tetrominoes and a domino cover 0…7... ).
        let wall: [(Shape, Point, Int)] = [(.tetrominoI, Point(0, 4), 0), (.tetrominoI, Point(4, 4), 0)]
        struct Case {
            var name: String
            var state: GameState
            var dealt: Shape
            var move: MoveInput
            var refused: [String]
        }
        let cases: [Case] = [
            Case(name: "plain legal move", state: state(), dealt: .domino, move: move(.domino, Point(0, 3), 0, [.up, .up]), refused: []),
            Case(name: "wrong kind", state: state(), dealt: .domino, move: move(.monomino, Point(0, 3)), refused: ["placement.kind"]),
            Case(name: "anchor missing", state: state(), dealt: .domino, move: move(.domino, nil), refused: ["placement.anchor"]),
            Case(
                name: "quarter turns out of range", state: state(), dealt: .domino, move: move(.domino, Point(0, 3), 4),
                refused: ["placement.quarter_turns"]),
            Case(name: "off the right edge", state: state(), dealt: .tetrominoI, move: move(.tetrominoI, Point(6, 3)), refused: ["placement.anchor"]),
            Case(name: "turned to fit the edge", state: state(), dealt: .tetrominoI, move: move(.tetrominoI, Point(8, 3), 1), refused: []),
            Case(
                name: "off the top when standing", state: state(), dealt: .tetrominoI, move: move(.tetrominoI, Point(0, 6), 1),
                refused: ["placement.anchor"]),
            Case(name: "negative anchor", state: state(), dealt: .monomino, move: move(.monomino, Point(-1, 2)), refused: ["placement.anchor"]),
            Case(name: "on FIRST's avatar", state: state(), dealt: .monomino, move: move(.monomino, Point(4, 0)), refused: ["placement.anchor"]),
            Case(name: "on SECOND's avatar", state: state(), dealt: .domino, move: move(.domino, Point(3, 8)), refused: ["placement.anchor"]),
            Case(
                name: "overlapping a shape", state: state(shapes: [(.domino, Point(2, 2), 0)]), dealt: .monomino,
                move: move(.monomino, Point(3, 2)), refused: ["placement.anchor"]),
            Case(
                name: "closing the last gap of a wall cuts both paths", state: state(shapes: wall), dealt: .monomino,
                move: move(.monomino, Point(8, 4)), refused: ["placement.anchor"]),
            Case(
                name: "below the gap it would cut FIRST off", state: state(shapes: wall), dealt: .monomino, move: move(.monomino, Point(8, 3)),
                refused: ["placement.anchor"]),
            Case(
                name: "elsewhere by the wall is fine", state: state(shapes: wall), dealt: .monomino, move: move(.monomino, Point(0, 3)),
                refused: []),
            Case(
                name: "the path ignores the other avatar: SECOND standing in the only gap does not count as a wall",
                state: state(shapes: wall, second: Point(8, 4)), dealt: .monomino, move: move(.monomino, Point(0, 5)), refused: []),
            Case(
                name: "boxing in one avatar only is still refused",
                state: state(shapes: [(.monomino, Point(3, 0), 0), (.monomino, Point(5, 0), 0)]), dealt: .monomino,
                move: move(.monomino, Point(4, 1), 0), refused: ["placement.anchor"]),
            Case(
                name: "a step into a shape", state: state(shapes: [(.monomino, Point(4, 1), 0)]), dealt: .monomino,
                move: move(.monomino, Point(0, 4), 0, [.up]), refused: ["steps[0]"]),
            Case(
                name: "a step into the shape just placed", state: state(), dealt: .monomino,
                move: move(.monomino, Point(4, 1), 0, [.up]), refused: ["steps[0]"]),
            Case(
                name: "a step off the board", state: state(), dealt: .monomino, move: move(.monomino, Point(0, 4), 0, [.down]), refused: ["steps[0]"]),
            Case(
                name: "four steps", state: state(), dealt: .monomino, move: move(.monomino, Point(0, 4), 0, [.up, .up, .up, .up]), refused: ["steps"]),
            Case(
                name: "onto the opponent", state: state(first: Point(4, 6)), dealt: .monomino,
                move: move(.monomino, Point(0, 4), 0, [.up, .up]), refused: ["steps[1]"]),
            Case(
                name: "around the opponent", state: state(first: Point(4, 6)), dealt: .monomino,
                move: move(.monomino, Point(0, 4), 0, [.right, .up, .up]), refused: []),
            Case(
                name: "the goal row ends the move", state: state(first: Point(4, 7), second: Point(0, 8)), dealt: .monomino,
                move: move(.monomino, Point(0, 4), 0, [.up, .right]), refused: ["steps[1]"]),
            Case(
                name: "back and forth is allowed", state: state(), dealt: .monomino, move: move(.monomino, Point(0, 4), 0, [.up, .down, .up]),
                refused: []),
            Case(
                name: "SECOND moves down towards row 0", state: state(turn: 2), dealt: .monomino,
                move: move(.monomino, Point(0, 4), 0, [.down, .down]),
                refused: []),
            Case(name: "no placement while one exists", state: state(), dealt: .monomino, move: move(nil, nil, 0, [.up]), refused: ["placement"]),
            Case(
                name: "several fields at once", state: state(), dealt: .domino,
                move: MoveInput(placement: .init(kind: 1, anchor: nil, quarterTurns: 7), steps: [9, 1]),
                refused: ["placement.kind", "placement.quarter_turns", "placement.anchor", "steps[0]"]),
        ]
        for c in cases {
            #expect(fields(GameRules.validate(c.move, dealt: c.dealt, in: c.state)) == c.refused, "\(c.name)")
        }
    }

    @Test func aPlacementMayBeOmittedOnlyWhenNoneIsLegal() {
        // A 5 × 5 board where no run of 4 free cells is left in any row or column (the avatars
        // count: a shape may not cover them), yet column 2 stays open for both avatars.
        let shapes: [(Shape, Point, Int)] = [Point(1, 0), Point(3, 1), Point(0, 2), Point(4, 2), Point(1, 3), Point(3, 4)].map {
            (.monomino, $0, 0)
        }
        let s = state(5, 5, shapes: shapes, first: Point(2, 0), second: Point(2, 4))
        // Column 2, row 2 is free: both avatars still have a path.
        #expect(s.shortestPath(.first) != nil && s.shortestPath(.second) != nil)
        #expect(GameRules.anyLegalPlacement(of: .tetrominoI, in: s) == nil)
        #expect(fields(GameRules.validate(move(nil, nil, 0, [.right]), dealt: .tetrominoI, in: s)) == [])
        #expect(GameRules.anyLegalPlacement(of: .monomino, in: s) != nil)
        #expect(fields(GameRules.validate(move(nil, nil, 0, [.right]), dealt: .monomino, in: s)) == ["placement"])
    }

    @Test func goalAndTurnLimit() throws {
        let s = state(first: Point(4, 7), second: Point(0, 8))
        let v = try GameRules.validate(move(.monomino, Point(0, 4), 0, [.up]), dealt: .monomino, in: s).get()
        #expect(v.reachedGoal)
        #expect(GameRules.outcome(after: v, state: s.applying(v)) == .goalReached(winner: .first))

        // Turn 200 played: shorter shortest path wins, equal is a draw.
        let last = state(first: Point(4, 3), second: Point(4, 6), turn: 200)
        let quiet = try GameRules.validate(move(.monomino, Point(0, 4)), dealt: .monomino, in: last).get()
        let after = last.applying(quiet)
        #expect(after.isTurnLimitReached)
        // FIRST needs 5 rows, SECOND 6: FIRST wins.
        #expect(GameRules.outcome(after: quiet, state: after) == .turnLimit(winner: .first))
        let even = state(first: Point(4, 3), second: Point(4, 5), turn: 200)
        let q2 = try GameRules.validate(move(.monomino, Point(0, 4)), dealt: .monomino, in: even).get()
        #expect(GameRules.outcome(after: q2, state: even.applying(q2)) == .turnLimit(winner: nil))
        // Turn 199 does not end it.
        let before = state(turn: 199)
        let q3 = try GameRules.validate(move(.monomino, Point(0, 4)), dealt: .monomino, in: before).get()
        #expect(GameRules.outcome(after: q3, state: before.applying(q3)) == nil)
    }

    // MARK: Glicko-2

    /// Glickman, "Example of the Glicko-2 system": 1500/200/0.06 against 1400/30 (win), 1550/100
    /// (loss), 1700/300 (loss), τ = 0.5 → 1464.06 / 151.52 / 0.05999.
    @Test func glicko2MatchesGlickmansWorkedExample() {
        let player = Glicko2.Rating(rating: 1500, deviation: 200, volatility: 0.06)
        let after = Glicko2.update(
            player,
            results: [
                .init(opponent: .init(rating: 1400, deviation: 30), score: 1),
                .init(opponent: .init(rating: 1550, deviation: 100), score: 0),
                .init(opponent: .init(rating: 1700, deviation: 300), score: 0),
            ])
        #expect(abs(after.rating - 1464.06) < 0.01, "rating \(after.rating)")
        #expect(abs(after.deviation - 151.52) < 0.01, "deviation \(after.deviation)")
        #expect(abs(after.volatility - 0.05999) < 0.00001, "volatility \(after.volatility)")
    }

    @Test func glicko2BasicsAndIdleWidening() {
        let a = Glicko2.Rating(), b = Glicko2.Rating()
        let win = Glicko2.update(a, results: [.init(opponent: b, score: 1)])
        let loss = Glicko2.update(b, results: [.init(opponent: a, score: 0)])
        #expect(win.rating > 1500 && loss.rating < 1500)
        #expect(abs((win.rating - 1500) + (loss.rating - 1500)) < 1e-6)  // symmetric from equal starts
        #expect(win.deviation < 350)
        let draw = Glicko2.update(a, results: [.init(opponent: b, score: 0.5)])
        #expect(abs(draw.rating - 1500) < 1e-9)
        let settled = Glicko2.Rating(rating: 1600, deviation: 60, volatility: 0.06)
        #expect(Glicko2.idle(settled, periods: 30).deviation > 60)
        #expect(Glicko2.idle(Glicko2.Rating(), periods: 1000).deviation == 350)
        #expect(Glicko2.isProvisional(deviation: 100, ratedMatches: 4))
        #expect(!Glicko2.isProvisional(deviation: 100, ratedMatches: 5))
        #expect(Glicko2.isProvisional(deviation: 111, ratedMatches: 50))
    }

    // MARK: Queue pairing

    func tickets(_ list: [(String, Double, Int64)]) -> [QueuePairing.Ticket] {
        list.enumerated().map { QueuePairing.Ticket(id: UInt64($0.offset), userID: $0.element.0, rating: $0.element.1, joinedAt: $0.element.2) }
    }

    @Test func theWindowWidensAsTheContractSays() {
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 0) == 50)
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 9_999) == 50)
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 10_000) == 100)
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 59_999) == 300)
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 60_000).isInfinite)
        #expect(QueuePairing.halfWidth(waitedMilliseconds: 70 * 60_000).isInfinite)
    }

    @Test func pairingTakesClosestFirstInsideBothWindows() {
        let now: Int64 = 1_000_000
        // a 1500, b 1540, c 1560: b–c (20) is closer than a–b (40).
        var plan = QueuePairing.plan(tickets([("a", 1500, now), ("b", 1540, now), ("c", 1560, now)]), now: now) { _, _ in false }
        #expect(plan.pairs.count == 1)
        let t = tickets([("a", 1500, now), ("b", 1540, now), ("c", 1560, now)])
        #expect(Set(plan.pairs.flatMap { [t[$0.first].userID, t[$0.second].userID] }) == ["b", "c"])
        // 80 apart: nobody at first; after 10 s a's window is 100 but b's is still 50 → no; both waited → yes.
        let far = tickets([("a", 1500, now - 10_000), ("b", 1580, now)])
        #expect(QueuePairing.plan(far, now: now) { _, _ in false }.pairs.isEmpty)
        let both = tickets([("a", 1500, now - 10_000), ("b", 1580, now - 10_000)])
        plan = QueuePairing.plan(both, now: now) { _, _ in false }
        #expect(plan.pairs.count == 1)
        #expect(both[plan.pairs[0].first].userID == "a")  // ties in waiting: the lower ticket id
        // Blocked pairs never; unknown ones are asked about and held back.
        #expect(QueuePairing.plan(tickets([("a", 1500, now), ("b", 1510, now)]), now: now) { _, _ in true }.pairs.isEmpty)
        let unknown = QueuePairing.plan(tickets([("a", 1500, now), ("b", 1510, now)]), now: now) { _, _ in nil }
        #expect(unknown.pairs.isEmpty && unknown.unknown.count == 1)
        // Blocked closest pair: each finds the next best instead.
        let four = tickets([("a", 1500, now), ("b", 1501, now), ("c", 1502, now), ("d", 1503, now)])
        plan = QueuePairing.plan(four, now: now) { x, y in Set([x, y]) == ["a", "b"] || Set([x, y]) == ["c", "d"] }
        let pairs = Set(plan.pairs.map { Set([four[$0.first].userID, four[$0.second].userID]) })
        #expect(pairs == [Set(["b", "c"]), Set(["a", "d"])])
        // Never oneself (one user, two tickets cannot happen in the queue, but the rule holds).
        #expect(QueuePairing.plan(tickets([("a", 1500, now), ("a", 1500, now)]), now: now) { _, _ in false }.pairs.isEmpty)
        // After 60 s anyone.
        let longWait = tickets([("a", 1000, now - 60_000), ("b", 2500, now - 60_000)])
        #expect(QueuePairing.plan(longWait, now: now) { _, _ in false }.pairs.count == 1)
    }

    // MARK: Leaderboard index

    @Test func rankIndexOrdersStablyAndPages() {
        let index = RankIndex(chunkLimit: 8)
        var keys: [RankIndex.Key] = []
        for i in 0..<200 {
            keys.append(RankIndex.Key(rating: Double(1500 + (i % 37)), deviation: Double(50 + i % 3), reachedAt: Int64(i), userID: "u\(i)"))
        }
        index.load(keys.map { ($0, 1) })
        let sorted = keys.sorted()
        #expect(index.page(from: 0, limit: 500).map(\.key) == sorted)
        for (i, k) in sorted.enumerated() { #expect(index.rank(of: k.userID) == i + 1) }
        // Updates in version order; an old version is ignored.
        index.update(userID: "u5", key: RankIndex.Key(rating: 9999, deviation: 40, reachedAt: 1, userID: "u5"), version: 2)
        #expect(index.rank(of: "u5") == 1)
        index.update(userID: "u5", key: RankIndex.Key(rating: 0, deviation: 40, reachedAt: 1, userID: "u5"), version: 1)
        #expect(index.rank(of: "u5") == 1)
        index.update(userID: "u5", key: nil, version: 3)
        #expect(index.rank(of: "u5") == nil)
        #expect(index.count == 199)
        index.remove(userID: "u6")
        #expect(index.count == 198)
        // Ties: equal rating and deviation, the earlier reach first.
        let tie = RankIndex()
        tie.load([
            (RankIndex.Key(rating: 1600, deviation: 80, reachedAt: 20, userID: "late"), 1),
            (RankIndex.Key(rating: 1600, deviation: 80, reachedAt: 10, userID: "early"), 1),
            (RankIndex.Key(rating: 1600, deviation: 70, reachedAt: 30, userID: "surer"), 1),
        ])
        #expect(tie.page(from: 0, limit: 3).map(\.key.userID) == ["surer", "early", "late"])
    }
}
