import Contracts
import Foundation
import Logging
import Matchmaking
import RPCCore
import RPCTransport
import ServiceKit
import Synchronization

// The matchmaking rows of scripts/bench (scripts/bench.d/matchmaking.sh runs this, release build):
//   matchmaking-bench engine                     in-process: the matchmaker, the rules engine, the leaderboard index
//   matchmaking-bench signup ACC_PORT            a user in accounts: prints user_id and token
//   matchmaking-bench seed DIR USER_ID N         writes N rated players (USER_ID among them) into DIR's database
//   matchmaking-bench e2e MM_PORT TOKEN SECS [C] SubmitMove and GetMatch req/s, GetLeaderboard µs, over gRPC
// Every figure is printed as `key=value` lines for the script.

struct Rng: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    /// Normal(mean, sd) by Box–Muller.
    mutating func normal(_ mean: Double, _ sd: Double) -> Double {
        let u1 = max(Double.leastNonzeroMagnitude, Double.random(in: 0..<1, using: &self)), u2 = Double.random(in: 0..<1, using: &self)
        return mean + sd * (-2 * log(u1)).squareRoot() * cos(2 * Double.pi * u2)
    }
}

func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

/// CPU time of this thread (seconds): the machine is shared, so in-process rows count the work
/// done, not the wall time other processes took from it.
func cpuNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

func time<T>(_ body: () -> T) -> (T, Double) {
    let start = cpuNow()
    let result = body()
    return (result, cpuNow() - start)
}

func percentile(_ xs: [Double], _ p: Double) -> Double {
    let s = xs.sorted()
    return s.isEmpty ? 0 : s[min(s.count - 1, Int((p / 100 * Double(s.count - 1)).rounded()))]
}

func out(_ key: String, _ value: Any) { print("\(key)=\(value)") }

// MARK: engine

func tickets(_ n: Int, rng: inout Rng, now: Int64, spreadMs: Int64) -> [QueuePairing.Ticket] {
    (0..<n).map { i in
        QueuePairing.Ticket(
            id: UInt64(i), userID: "u\(i)", rating: min(3000, max(100, rng.normal(1500, 300))),
            joinedAt: now - Int64.random(in: 0...spreadMs, using: &rng))
    }
}

func engine() {
    var rng = Rng(state: 42)
    let now: Int64 = 10_000_000

    // One pairing pass as the queue grows (fresh tickets, ±50 windows; best of 3).
    for n in [1_000, 10_000, 100_000] {
        let t = tickets(n, rng: &rng, now: now, spreadMs: 0)
        var best = Double.infinity
        var pairs = 0
        for _ in 0..<3 {
            let (plan, s) = time { QueuePairing.plan(t, now: now) { _, _ in false } }
            best = min(best, s)
            pairs = plan.pairs.count
        }
        out("pass_\(n)_us", Int(best * 1e6))
        out("pass_\(n)_pairs", pairs)
        out("pass_\(n)_ns_per_nlogn", String(format: "%.1f", best * 1e9 / (Double(n) * log2(Double(n)))))
    }

    // 100,000 players arriving over 10 s (10,000/s), a pass every 200 ms as the service ticks:
    // pairs formed per second of matchmaker time, and each player's wait until paired (simulated).
    do {
        let total = 100_000, arrivalsPerTick = 2_000, tick: Int64 = 200
        var all = tickets(total, rng: &rng, now: 0, spreadMs: 0)
        var next = 0
        var queue: [QueuePairing.Ticket] = []
        var clock: Int64 = 0
        var waits: [Double] = []
        var passTime = 0.0, pairsFormed = 0, maxQueue = 0
        while clock < 120_000 && (next < total || queue.count >= 2) {
            for _ in 0..<arrivalsPerTick where next < total {
                all[next].joinedAt = clock + Int64.random(in: 0..<tick, using: &rng)
                queue.append(all[next])
                next += 1
            }
            clock += tick
            maxQueue = max(maxQueue, queue.count)
            let (remaining, s) = time { () -> [QueuePairing.Ticket] in
                let plan = QueuePairing.plan(queue, now: clock) { _, _ in false }
                var taken = [Bool](repeating: false, count: queue.count)
                for p in plan.pairs {
                    taken[p.first] = true
                    taken[p.second] = true
                    waits.append(Double(clock - queue[p.first].joinedAt) / 1000)
                    waits.append(Double(clock - queue[p.second].joinedAt) / 1000)
                }
                pairsFormed += plan.pairs.count
                return queue.indices.filter { !taken[$0] }.map { queue[$0] }
            }
            passTime += s
            queue = remaining
        }
        out("burst_players", total)
        out("burst_pairs_per_s", Int(Double(pairsFormed) / passTime))
        out("burst_wait_p50_s", String(format: "%.2f", percentile(waits, 50)))
        out("burst_wait_p99_s", String(format: "%.2f", percentile(waits, 99)))
        out("burst_unpaired", queue.count)
        out("burst_max_queue", maxQueue)
    }

    // SubmitMove in the rules engine on a 15 × 15 board late in a game.
    do {
        var s = GameState(columns: 15, rows: 15)
        let seed: UInt64 = 99
        while s.turn < 180 {
            let dealt = ShapeDealer.shape(seed: seed, turn: s.turn)
            var input = MoveInput(placement: nil, steps: [])
            for _ in 0..<200 {
                let q = Int.random(in: 0..<4, using: &rng)
                let a = Point(Int.random(in: 0..<15, using: &rng), Int.random(in: 0..<15, using: &rng))
                if let cells = GameRules.cells(of: dealt, anchor: a, quarterTurns: q, in: s), GameRules.placementProblem(cells, in: s) == nil {
                    input.placement = .init(kind: dealt.rawValue, anchor: a, quarterTurns: q)
                    break
                }
            }
            guard case .success(let v) = GameRules.validate(input, dealt: dealt, in: s) else { break }
            s = s.applying(v)
        }
        let dealt = ShapeDealer.shape(seed: seed, turn: s.turn)
        var move: MoveInput?
        for q in 0..<4 where move == nil {
            for r in 0..<15 where move == nil {
                for c in 0..<15 where move == nil {
                    if let cells = GameRules.cells(of: dealt, anchor: Point(c, r), quarterTurns: q, in: s),
                        GameRules.placementProblem(cells, in: s) == nil
                    {
                        move = MoveInput(placement: .init(kind: dealt.rawValue, anchor: Point(c, r), quarterTurns: q), steps: [])
                    }
                }
            }
        }
        // Steps: as many legal ones as the board allows.
        var m = move ?? MoveInput(placement: nil, steps: [])
        for st in [Step.up, .right, .left, .down] {
            var trial = m
            trial.steps.append(st.rawValue)
            if case .success = GameRules.validate(trial, dealt: dealt, in: s), trial.steps.count <= 3 { m = trial }
        }
        let iterations = 20_000
        var ok = 0
        let (_, t) = time {
            for _ in 0..<iterations {
                if case .success(let v) = GameRules.validate(m, dealt: dealt, in: s) {
                    _ = s.applying(v)
                    ok += 1
                }
            }
        }
        out("move_board", "15x15")
        out("move_turn", s.turn)
        out("move_shapes", s.shapes.count)
        out("move_free_cells", 225 - s.shapes.reduce(0) { $0 + $1.cells.count })
        out("move_steps", m.steps.count)
        out("move_validate_us", String(format: "%.2f", t * 1e6 / Double(iterations)))
        out("move_ok", ok == iterations)
    }

    // The leaderboard index at 100,000 ranked players: top 10 + my rank, and one update.
    do {
        let index = RankIndex()
        let keys = (0..<100_000).map {
            RankIndex.Key(rating: rng.normal(1500, 300), deviation: Double.random(in: 50...110, using: &rng), reachedAt: Int64($0), userID: "u\($0)")
        }
        index.load(keys.map { ($0, 1) })
        let n = 20_000
        let (_, t) = time {
            for i in 0..<n {
                _ = index.page(from: 0, limit: 10)
                _ = index.rank(of: "u\((i &* 7919) % 100_000)")
            }
        }
        out("leaderboard_index_us", String(format: "%.2f", t * 1e6 / Double(n)))
        let (_, u) = time {
            for i in 0..<n {
                let id = "u\((i &* 104_729) % 100_000)"
                index.update(
                    userID: id, key: RankIndex.Key(rating: rng.normal(1500, 300), deviation: 80, reachedAt: Int64(200_000 + i), userID: id),
                    version: Int64(2 + i))
            }
        }
        out("leaderboard_update_us", String(format: "%.2f", u * 1e6 / Double(n)))
    }
}

// MARK: seed

func seed(directory: String, userID: String, count: Int) throws {
    let peers = PeerClients { _ in RPCChannel(host: "127.0.0.1", port: 1).client }
    let core = try MatchmakingCore(
        configuration: MatchmakingConfiguration(dataDirectory: directory), peers: peers,
        logger: Logger(label: "seed") { _ in SwiftLogNoOpLogHandler() })
    defer { core.close() }
    var rng = Rng(state: 7)
    let now = SystemClock.nowMilliseconds()
    try core.database.writeSync { tx in
        for i in 0..<count {
            let id = i == count / 3 ? userID : "bench-\(i)"
            try tx.execute(
                "INSERT OR REPLACE INTO ratings (user_id, rating, deviation, volatility, rated_matches, updated_at, version) VALUES (?, ?, ?, 0.06, 20, ?, 1)",
                id, rng.normal(1500, 300), Double.random(in: 50...110, using: &rng), now - Int64(i))
            try tx.execute(
                "INSERT OR REPLACE INTO stats (user_id, matches_played, wins, losses) VALUES (?, 20, ?, ?)", id, i % 20, 20 - i % 20)
        }
    }
}

// MARK: e2e

func signUp(accountsPort: Int) async throws {
    let channel = RPCChannel(host: "127.0.0.1", port: accountsPort)
    let accounts = Accounts_V1_AccountsClient(channel.client)
    let name = "mmbench\(Int.random(in: 0..<1_000_000_000))"
    var signUp = Accounts_V1_SignUpRequest()
    signUp.username = name
    signUp.email = "\(name)@example.com"
    signUp.password = "correct horse battery staple"
    let r = try await accounts.signUp(signUp)
    out("user_id", r.user.userId)
    out("token", r.session.accessToken)
    await channel.close()
}

func legal(_ m: Matchmaking_V1_Match) -> Matchmaking_V1_SubmitMoveRequest {
    let b = m.board
    let s = GameState(
        columns: Int(b.columns), rows: Int(b.rows),
        shapes: b.shapes.map {
            PlacedShape(
                shape: Shape(rawValue: Int($0.kind.rawValue))!, anchor: Point(Int($0.anchor.column), Int($0.anchor.row)),
                quarterTurns: Int($0.quarterTurns), cells: $0.cells.map { Point(Int($0.column), Int($0.row)) }, seat: .first,
                turn: Int($0.turnNumber))
        },
        avatars: [Point(Int(b.firstAvatar.column), Int(b.firstAvatar.row)), Point(Int(b.secondAvatar.column), Int(b.secondAvatar.row))],
        turn: Int(m.turnNumber))
    var r = Matchmaking_V1_SubmitMoveRequest()
    r.matchId = m.matchId
    r.turnNumber = m.turnNumber
    let dealt = Shape(rawValue: Int(m.nextShape.rawValue))!
    var board = s
    var rng = Rng(state: UInt64(m.turnNumber) &* 31 &+ UInt64(b.shapes.count))
    var placement: (Point, Int)?
    for _ in 0..<60 {
        let q = Int.random(in: 0..<4, using: &rng), a = Point(Int.random(in: 0..<s.columns, using: &rng), Int.random(in: 0..<s.rows, using: &rng))
        if let cells = GameRules.cells(of: dealt, anchor: a, quarterTurns: q, in: s), GameRules.placementProblem(cells, in: s) == nil {
            placement = (a, q)
            break
        }
    }
    if placement == nil, let l = GameRules.anyLegalPlacement(of: dealt, in: s) { placement = (l.anchor, l.quarterTurns) }
    if let (a, q) = placement {
        var p = Matchmaking_V1_ShapePlacement()
        p.kind = m.nextShape
        var c = Matchmaking_V1_Cell()
        c.column = Int32(a.column)
        c.row = Int32(a.row)
        p.anchor = c
        p.quarterTurns = Int32(q)
        r.placement = p
        board = s.applying(
            try! GameRules.validate(MoveInput(placement: .init(kind: dealt.rawValue, anchor: a, quarterTurns: q), steps: []), dealt: dealt, in: s)
                .get())
    }
    // One sideways step when possible (games last long: the end-to-end row measures moves).
    let seat = s.seatToMove
    let at = board.avatar(seat)
    for st in [Step.right, .left] {
        let n = Point(at.column + st.delta.dc, at.row + st.delta.dr)
        if board.contains(n) && !board.isBlocked(n) && n != board.avatar(seat.other) {
            r.steps = [Matchmaking_V1_Direction(rawValue: Int32(st.rawValue))]
            break
        }
    }
    return r
}

func newMatch(_ mm: Matchmaking_V1_MatchmakingClient, _ options: CallOptions) async throws -> Matchmaking_V1_Match {
    var r = Matchmaking_V1_StartLocalMatchRequest()
    r.idempotencyKey = ULID.make()
    r.columns = 15
    r.rows = 15
    return try await mm.startLocalMatch(r, options: options).match
}

func e2e(matchmakingPort: Int, token: String, duration: Double, concurrency: Int) async throws {
    let channel = RPCChannel(host: "127.0.0.1", port: matchmakingPort)
    let mm = Matchmaking_V1_MatchmakingClient(channel.client)
    let options = CallOptions(timeout: .seconds(30), metadata: Metadata([("authorization", "Bearer \(token)")]))

    // SubmitMove: `concurrency` local matches played at once, each by its own task.
    let moves = Box(0), errors = Box(0)
    let clock = ContinuousClock()
    let end = clock.now + .milliseconds(Int(duration * 1000))
    var latencies: [Double] = []
    let lat = Box<[Double]>([])
    try await withThrowingTaskGroup(of: Void.self) { group in
        for _ in 0..<concurrency {
            group.addTask {
                var m = try await newMatch(mm, options)
                var local: [Double] = []
                while clock.now < end {
                    if m.status != .active { m = try await newMatch(mm, options) }
                    let start = clock.now
                    do {
                        m = try await mm.submitMove(legal(m), options: options).match
                        local.append(seconds(clock.now - start))
                        moves.withLock { $0 += 1 }
                    } catch {
                        errors.withLock { $0 += 1 }
                        m = try await newMatch(mm, options)
                    }
                }
                let l = local
                lat.withLock { $0 += l }
            }
        }
        try await group.waitForAll()
    }
    latencies = lat.withLock { $0 }
    out("submit_move_rps", Int(Double(moves.withLock { $0 }) / duration))
    out("submit_move_p50_ms", String(format: "%.2f", percentile(latencies, 50) * 1000))
    out("submit_move_p99_ms", String(format: "%.2f", percentile(latencies, 99) * 1000))
    out("submit_move_errors", errors.withLock { $0 })

    // The reference in the same run: GetMatch (a read of the same row) with the same concurrency.
    let m = try await newMatch(mm, options)
    let reads = Box(0)
    let end2 = clock.now + .milliseconds(Int(duration * 1000))
    try await withThrowingTaskGroup(of: Void.self) { group in
        for _ in 0..<concurrency {
            group.addTask {
                var r = Matchmaking_V1_GetMatchRequest()
                r.matchId = m.matchId
                while clock.now < end2 {
                    _ = try await mm.getMatch(r, options: options)
                    reads.withLock { $0 += 1 }
                }
            }
        }
        try await group.waitForAll()
    }
    out("get_match_rps", Int(Double(reads.withLock { $0 }) / duration))

    // GetLeaderboard (top 10 + my rank), one call at a time.
    var lb = Matchmaking_V1_GetLeaderboardRequest()
    lb.pageSize = 10
    var times: [Double] = []
    var ranked = 0
    for _ in 0..<2_000 {
        let start = clock.now
        let r = try await mm.getLeaderboard(lb, options: options)
        times.append(seconds(clock.now - start))
        ranked = Int(r.rankedPlayers)
    }
    out("leaderboard_ranked", ranked)
    out("leaderboard_rpc_p50_us", Int(percentile(times, 50) * 1e6))
    out("leaderboard_rpc_p99_us", Int(percentile(times, 99) * 1e6))
    await channel.close()
}

/// A value shared by the client tasks.
final class Box<T: Sendable>: Sendable {
    private let m: Mutex<T>
    init(_ v: T) { m = Mutex(v) }
    func withLock<R: Sendable>(_ body: (inout T) -> R) -> R { m.withLock { body(&$0) } }
}

// MARK: main

let args = CommandLine.arguments
switch args.dropFirst().first {
case "engine":
    engine()
case "seed":
    try seed(directory: args[2], userID: args[3], count: Int(args[4])!)
case "signup":
    try await signUp(accountsPort: Int(args[2])!)
case "e2e":
    try await e2e(
        matchmakingPort: Int(args[2])!, token: args[3], duration: Double(args[4])!, concurrency: args.count > 5 ? Int(args[5])! : 16)
default:
    print("usage: matchmaking-bench engine | signup ACC_PORT | seed DIR USER_ID N | e2e MM_PORT TOKEN SECONDS [CONCURRENCY]")
}
