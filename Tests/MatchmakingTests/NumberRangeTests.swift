import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Matchmaking

/// Issue 35: every number a client sends matchmaking (board sizes, turn numbers, cells, quarter
/// turns, enum numbers, sequences, page sizes) is checked for range before it is used, answered
/// INVALID_ARGUMENT naming the field. A trap (overflow, index out of range) would end this test
/// process, and in production the service.
@Suite("Matchmaking: numbers at their extremes")
struct NumberRangeTests {
    static let int32Extremes: [Int32] = [.min, -1, .max]

    @Test func boardSizesPageSizesAndFiltersAtTheirExtremes() async throws {
        try await withMatchmaking { env in
            let p = try await env.player()
            for v: Int32 in [.min, -1, 4, 16, .max] {
                var r = Matchmaking_V1_StartLocalMatchRequest()
                r.idempotencyKey = ULID.make()
                r.columns = v
                r.rows = v
                await expectFailure(.invalidArgument, fields: ["columns", "rows"], "size \(v)") {
                    try await env.mm.startLocalMatch(r, options: p.options)
                }
            }
            let m = try await env.local(p, columns: 15, rows: 5)
            #expect(m.board.columns == 15 && m.board.rows == 5)

            for size: Int32 in [.min, -1] {
                var mine = Matchmaking_V1_ListMyMatchesRequest()
                mine.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.listMyMatches(mine, options: p.options) }
                var challenges = Matchmaking_V1_ListChallengesRequest()
                challenges.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.listChallenges(challenges, options: p.options) }
                var chat = Matchmaking_V1_ListChatMessagesRequest()
                chat.matchId = m.matchId
                chat.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.listChatMessages(chat, options: p.options) }
                var moves = Matchmaking_V1_ListMatchMovesRequest()
                moves.matchId = m.matchId
                moves.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.listMatchMoves(moves, options: p.options) }
                var board = Matchmaking_V1_GetLeaderboardRequest()
                board.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.getLeaderboard(board, options: p.options) }
            }
            // Int32.max is clamped to each list's maximum.
            var mine = Matchmaking_V1_ListMyMatchesRequest()
            mine.pageSize = .max
            #expect(try await env.mm.listMyMatches(mine, options: p.options).matches.count == 1)
            var moves = Matchmaking_V1_ListMatchMovesRequest()
            moves.matchId = m.matchId
            moves.pageSize = .max
            #expect(try await env.mm.listMatchMoves(moves, options: p.options).moves.isEmpty)
            var board = Matchmaking_V1_GetLeaderboardRequest()
            board.pageSize = .max
            #expect(try await env.mm.getLeaderboard(board, options: p.options).entries.isEmpty)

            // Enum numbers outside the contract's enums.
            for raw in Self.int32Extremes {
                var filter = Matchmaking_V1_ListMyMatchesRequest()
                filter.status = .unrecognized(raw)
                filter.kind = .unrecognized(raw)
                await expectFailure(.invalidArgument, fields: ["status", "kind"]) { try await env.mm.listMyMatches(filter, options: p.options) }
                var challenges = Matchmaking_V1_ListChallengesRequest()
                challenges.direction = .unrecognized(raw)
                challenges.statuses = [.pending, .unrecognized(raw)]
                await expectFailure(.invalidArgument, fields: ["direction", "statuses[1]"]) {
                    try await env.mm.listChallenges(challenges, options: p.options)
                }
            }
        }
    }

    @Test func movesWithNumbersOutsideTheBoardAndTheTurnsAreNamed() async throws {
        try await withMatchmaking { env in
            let p = try await env.player()
            let m = try await env.local(p)
            let legal = MatchEnv.legalMove(m, steps: 1)
            #expect(legal.hasPlacement)

            // turn_number: 1..200 (a match has at most 200 turns); outside → INVALID_ARGUMENT.
            for turn: Int32 in [.min, -1, 0, 201, .max] {
                var r = legal
                r.turnNumber = turn
                await expectFailure(.invalidArgument, fields: ["turn_number"], "turn \(turn)") { try await env.mm.submitMove(r, options: p.options) }
            }
            // quarter_turns and the shape's kind: named before the board is looked at.
            for q in Self.int32Extremes + [4] {
                var r = legal
                r.placement.quarterTurns = q
                r.placement.kind = .unrecognized(q == 4 ? 12 : q)  // 4 is a kind (SHAPE_KIND_TROMINO_L); 12 is none
                await expectFailure(.invalidArgument, fields: ["placement.quarter_turns", "placement.kind"], "quarter turns \(q)") {
                    try await env.mm.submitMove(r, options: p.options)
                }
            }
            // An anchor anywhere off the board, up to the Int32 extremes: the shape leaves it.
            let anchors: [(Int32, Int32)] = [(.max, .max), (.min, .min), (.max, 0), (0, .min), (-1, 0), (9, 0), (0, 9), (.max - 1, .max - 1)]
            for (column, row) in anchors {
                var r = legal
                r.placement.anchor.column = column
                r.placement.anchor.row = row
                await expectFailure(.invalidArgument, fields: ["placement.anchor"], "anchor (\(column), \(row))") {
                    try await env.mm.submitMove(r, options: p.options)
                }
            }
            // Server-filled fields of the placement are ignored, whatever their numbers.
            var filled = legal
            filled.placement.turnNumber = .min
            filled.placement.placedBy = .unrecognized(.max)
            var far = Matchmaking_V1_Cell()
            far.column = .max
            far.row = .min
            filled.placement.cells = [far]
            // Steps: direction numbers outside the enum, and more than three.
            var steps = filled
            steps.steps = [.unrecognized(.max), .unrecognized(.min), .unrecognized(-1)]
            await expectFailure(.invalidArgument, fields: ["steps[0]", "steps[1]", "steps[2]"]) {
                try await env.mm.submitMove(steps, options: p.options)
            }
            steps.steps = Array(repeating: .up, count: 1000)
            await expectFailure(.invalidArgument, fields: ["steps"]) { try await env.mm.submitMove(steps, options: p.options) }
            // The match is untouched: the legal move (with those ignored fields) is turn 1.
            let played = try await env.mm.submitMove(filled, options: p.options)
            #expect(played.move.turnNumber == 1 && played.match.turnNumber == 2)
            // A retry of turn 1 answers the recorded move; turn 200 is in range but not this turn's.
            #expect(try await env.mm.submitMove(filled, options: p.options).replayed)
            var late = MatchEnv.legalMove(played.match, steps: 0)
            late.turnNumber = 200
            await expectFailure(.failedPrecondition, fields: ["turn_number"]) { try await env.mm.submitMove(late, options: p.options) }
        }
    }

    @Test func watchSequencesAtTheInt64Extremes() async throws {
        try await withMatchmaking { env in
            let p = try await env.player()
            let m = try await env.local(p)
            for after: Int64 in [-1, .min] {
                var r = Matchmaking_V1_WatchMatchRequest()
                r.matchId = m.matchId
                r.afterSequence = after
                await expectFailure(.invalidArgument, fields: ["after_sequence"]) {
                    try await env.mm.watchMatch(r, options: p.options) { stream in
                        for try await _ in stream.messages {}
                    }
                }
            }
            // Past the match's last event (Int64.max): the stream starts with a snapshot.
            let watcher = env.watch(m.matchId, p, after: .max)
            #expect(await watcher.waitFor { $0.first?.snapshot.matchId == m.matchId })
            await watcher.cancel()
        }
    }
}
