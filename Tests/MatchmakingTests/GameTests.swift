import Contracts
import Foundation
import GRPCContracts
import RPCCore
import ServiceKit
import ServiceKitTesting
import Synchronization
import Testing

@testable import Matchmaking

/// Every RPC and every error the contract names, over real gRPC with the real accounts and social.
@Suite("Matchmaking: over gRPC", .serialized)
struct GameTests {
    // MARK: Challenges

    @Test func challengesBetweenFriends() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a"), b = try await env.player("b"), stranger = try await env.player("s")
            try await env.befriend(a, b)
            let mm = env.mm

            // Field errors named together; oneself; unknown; not a friend.
            var bad = Matchmaking_V1_CreateChallengeRequest()
            bad.message = String(repeating: "x", count: 101)
            await expectFailure(.invalidArgument, fields: ["idempotency_key", "message", "opponent"]) {
                try await mm.createChallenge(bad, options: a.options)
            }
            var selfie = Matchmaking_V1_CreateChallengeRequest()
            selfie.idempotencyKey = "k1"
            selfie.opponentUserId = a.id
            await expectFailure(.invalidArgument, fields: ["opponent_user_id"]) { try await mm.createChallenge(selfie, options: a.options) }
            var unknown = Matchmaking_V1_CreateChallengeRequest()
            unknown.idempotencyKey = "k2"
            unknown.opponentUsername = "nobody-\(ULID.make().lowercased())"
            await expectFailure(.notFound, fields: ["opponent_username"]) { try await mm.createChallenge(unknown, options: a.options) }
            await expectFailure(.permissionDenied) { try await env.challenge(a, stranger) }

            // Create (idempotent), notified through social, listed both ways.
            var create = Matchmaking_V1_CreateChallengeRequest()
            create.idempotencyKey = "challenge-1"
            create.opponentUsername = b.username.uppercased()
            create.rated = true
            create.message = "  good luck  "
            let first = try await mm.createChallenge(create, options: a.options)
            #expect(first.challenge.status == .pending && first.challenge.message == "good luck" && !first.replayed)
            #expect(first.challenge.challenger.username == a.username && first.challenge.challenged.userId == b.id)
            let again = try await mm.createChallenge(create, options: a.options)
            #expect(again.replayed && again.challenge.challengeId == first.challenge.challengeId)
            var other = create
            other.rated = false
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) { try await mm.createChallenge(other, options: a.options) }
            other.idempotencyKey = "challenge-2"
            await expectFailure(.alreadyExists) { try await mm.createChallenge(other, options: a.options) }
            await expectFailure(.alreadyExists, "either direction") { try await env.challenge(b, a) }
            let note = try await env.waitForNotification(b, kind: .challenge)
            #expect(note?.target.challengeId == first.challenge.challengeId)

            var list = Matchmaking_V1_ListChallengesRequest()
            list.direction = .incoming
            #expect(try await mm.listChallenges(list, options: b.options).challenges.map(\.challengeId) == [first.challenge.challengeId])
            #expect(try await mm.listChallenges(list, options: a.options).challenges.isEmpty)

            // Only the challenged answers; the challenger withdraws.
            var accept = Matchmaking_V1_AcceptChallengeRequest()
            accept.challengeId = first.challenge.challengeId
            await expectFailure(.permissionDenied) { try await mm.acceptChallenge(accept, options: a.options) }
            await expectFailure(.notFound) { try await mm.acceptChallenge(accept, options: stranger.options) }
            var reject = Matchmaking_V1_RejectChallengeRequest()
            reject.challengeId = first.challenge.challengeId
            let rejected = try await mm.rejectChallenge(reject, options: b.options)
            #expect(rejected.challenge.status == .rejected)
            #expect(try await mm.rejectChallenge(reject, options: b.options).challenge.status == .rejected)  // a retry
            await expectFailure(.permissionDenied, fields: ["challenge_id"]) { try await mm.rejectChallenge(reject, options: a.options) }
            await expectFailure(.notFound, fields: ["challenge_id"]) { try await mm.rejectChallenge(reject, options: stranger.options) }
            _ = try await env.waitForNotification(a, kind: .challengeAnswered)
            await expectFailure(.failedPrecondition, fields: ["challenge_id"]) { try await mm.acceptChallenge(accept, options: b.options) }

            let second = try await env.challenge(a, b, rated: false)
            var cancel = Matchmaking_V1_CancelChallengeRequest()
            cancel.challengeId = second.challengeId
            await expectFailure(.permissionDenied) { try await mm.cancelChallenge(cancel, options: b.options) }
            #expect(try await mm.cancelChallenge(cancel, options: a.options).challenge.status == .cancelled)
            #expect(try await mm.cancelChallenge(cancel, options: a.options).challenge.status == .cancelled)  // a retry
            await expectFailure(.notFound, fields: ["challenge_id"]) { try await mm.cancelChallenge(cancel, options: stranger.options) }
            reject.challengeId = second.challengeId
            await expectFailure(.failedPrecondition, fields: ["challenge_id"]) { try await mm.rejectChallenge(reject, options: b.options) }

            // Expiry after 10 minutes.
            let third = try await env.challenge(a, b)
            env.clock.advance(by: .seconds(601))
            accept.challengeId = third.challengeId
            let f = await expectFailure(.failedPrecondition) { try await mm.acceptChallenge(accept, options: b.options) }
            #expect(f?.message.contains("expired") == true)
            list.direction = .unspecified
            list.statuses = [.expired, .rejected, .cancelled]
            #expect(try await mm.listChallenges(list, options: a.options).challenges.count == 3)

            // Accept: the challenger is FIRST, rated as asked; a retried accept answers the same.
            let fourth = try await env.challenge(a, b)
            accept.challengeId = fourth.challengeId
            let accepted = try await mm.acceptChallenge(accept, options: b.options)
            #expect(accepted.challenge.status == .accepted && accepted.match.kind == .challenge && accepted.match.rated)
            #expect(accepted.match.first.user.userId == a.id && accepted.match.second.user.userId == b.id)
            #expect(accepted.challenge.matchId == accepted.match.matchId)
            #expect(try await mm.acceptChallenge(accept, options: b.options).match.matchId == accepted.match.matchId)

            // A block stops challenges.
            try await env.block(b, a)
            await expectFailure(.permissionDenied) { try await env.challenge(a, b) }
        }
    }

    @Test func socialDownMeansAClearUnavailable() async throws {
        try await withMatchmaking(socialUp: false) { env in
            let a = try await env.player("a"), b = try await env.player("b")
            let f = await expectFailure(.unavailable) { try await env.challenge(a, b) }
            #expect(f?.message.contains("social") == true)
            #expect(f?.retryDelaySeconds != nil)
            // Local play needs nobody.
            _ = try await env.local(a)
        }
    }

    // MARK: Moves

    @Test func movesAreValidatedOnTheServer() async throws {
        try await withMatchmaking { env in
            let (a, b, m) = try await env.friendlyMatch()
            let mm = env.mm
            #expect(m.turnNumber == 1 && m.seatToMove == .first && m.nextShape != .unspecified && m.shapeAfterNext != .unspecified)
            #expect(m.hasTurnDeadline)

            // Shape errors: every bad field named.
            var r = MatchEnv.legalMove(m)
            r.placement.kind = .unspecified
            r.placement.quarterTurns = 9
            r.steps = [.up, .up, .up, .up]
            await expectFailure(.invalidArgument, fields: ["placement.kind", "placement.quarter_turns", "steps"]) {
                try await mm.submitMove(r, options: a.options)
            }
            r = MatchEnv.legalMove(m)
            r.placement.anchor.column = 100
            await expectFailure(.invalidArgument, fields: ["placement.anchor"]) { try await mm.submitMove(r, options: a.options) }
            r = MatchEnv.legalMove(m)
            r.clearPlacement()
            await expectFailure(.invalidArgument, fields: ["placement"]) { try await mm.submitMove(r, options: a.options) }
            r = MatchEnv.legalMove(m)
            r.steps = [.down]
            await expectFailure(.invalidArgument, fields: ["steps[0]"]) { try await mm.submitMove(r, options: a.options) }
            r = MatchEnv.legalMove(m)
            r.turnNumber = 0
            r.matchId = ""
            await expectFailure(.invalidArgument, fields: ["match_id", "turn_number"]) { try await mm.submitMove(r, options: a.options) }
            // Out of turn; a future turn; a stranger.
            await expectFailure(.failedPrecondition) { try await mm.submitMove(MatchEnv.legalMove(m), options: b.options) }
            r = MatchEnv.legalMove(m)
            r.turnNumber = 2
            await expectFailure(.failedPrecondition, fields: ["turn_number"]) { try await mm.submitMove(r, options: a.options) }
            let stranger = try await env.player("s")
            await expectFailure(.notFound) { try await mm.submitMove(MatchEnv.legalMove(m), options: stranger.options) }

            // Two submissions racing for turn 1: exactly one counts; the same content is a replay,
            // another move FAILED_PRECONDITION.
            let move = MatchEnv.legalMove(m)
            async let x = try? mm.submitMove(move, options: a.options)
            async let y = try? mm.submitMove(move, options: a.options)
            let oks = await [x, y].compactMap { $0 }
            #expect(oks.count == 2 && oks.filter(\.replayed).count == 1)
            let after = oks[0].match
            #expect(after.turnNumber == 2 && after.seatToMove == .second)
            var different = move
            different.steps = []
            await expectFailure(.failedPrecondition, fields: ["turn_number"]) { try await mm.submitMove(different, options: a.options) }
            var moves = Matchmaking_V1_ListMatchMovesRequest()
            moves.matchId = m.matchId
            #expect(try await mm.listMatchMoves(moves, options: b.options).moves.count == 1)
            moves.pageSize = 500  // clamped to the contract's 200
            #expect(try await mm.listMatchMoves(moves, options: b.options).moves.count == 1)
            moves.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await mm.listMatchMoves(moves, options: b.options) }

            // Timeout: SECOND misses the deadline.
            env.clock.advance(by: .seconds(61))
            _ = await eventually { (try? await env.getMatch(m.matchId, a).status) == .finished }
            let over = try await env.getMatch(m.matchId, a)
            #expect(over.outcome.reason == .timeout && over.outcome.winner == .first && over.outcome.loserByForfeit == .second)
            #expect(over.outcome.ratingChanges.count == 2)
            await expectFailure(.failedPrecondition) { try await mm.submitMove(MatchEnv.legalMove(after), options: b.options) }
        }
    }

    @Test func aMatchPlayedToTheGoalWithRatingsStatsRematchAndReplay() async throws {
        try await withMatchmaking { env in
            let (a, b, m) = try await env.friendlyMatch(rated: true)
            let mm = env.mm
            let watchA = env.watch(m.matchId, a), watchB = env.watch(m.matchId, b)
            #expect(await watchA.waitFor { $0.contains { if case .snapshot? = $0.event { true } else { false } } })
            #expect(await watchB.waitFor { $0.count >= 1 })
            let (played, final) = try await env.playOut(m, first: a, second: b)
            #expect(final.status == .finished && final.outcome.reason == .goalReached)
            let winner = final.outcome.winner == .first ? a : b, loser = final.outcome.winner == .first ? b : a
            #expect(final.outcome.ratingChanges.count == 2)
            #expect(await watchA.waitFor { $0.contains { if case .matchOver? = $0.event { true } else { false } } })
            // Both saw every move, in order, without gaps or repeats.
            for w in [watchA, watchB] {
                #expect(await w.waitFor { $0.filter { if case .movePlayed? = $0.event { true } else { false } }.count == played.count })
                let seqs = w.all.map(\.sequence)
                #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count)
            }
            // Presence: B's stream is shown to A (live, or already in A's snapshot).
            #expect(
                watchA.all.contains {
                    switch $0.event {
                    case .presence(let p)?: p.seat == .second && p.connected
                    case .snapshot(let s)?: s.second.connected
                    default: false
                    }
                })

            // Stats and ratings.
            var stats = Matchmaking_V1_GetPlayerStatsRequest()
            let ws = try await mm.getPlayerStats(stats, options: winner.options).stats
            #expect(ws.matchesPlayed == 1 && ws.wins == 1 && ws.winRate == 1 && ws.winsByGoal == 1 && ws.currentWinStreak == 1)
            #expect(ws.movesPlayed > 0 && ws.rating.rating > 1500 && ws.rating.ratedMatches == 1 && ws.rating.provisional)
            stats.userId = winner.id
            let seen = try await mm.getPlayerStats(stats, options: loser.options).stats  // friends see each other's
            #expect(seen.losses == 0 && seen.wins == 1)
            var rating = Matchmaking_V1_GetRatingRequest()
            rating.userId = loser.id
            let lr = try await mm.getRating(rating, options: winner.options)
            #expect(lr.rating.rating < 1500 && lr.rank == 0 && lr.user.username == loser.username)

            // Replay equals what was played.
            var replay = Matchmaking_V1_GetMatchReplayRequest()
            replay.matchId = m.matchId
            let rp = try await mm.getMatchReplay(replay, options: a.options)
            #expect(rp.moves.map(\.turnNumber) == played.map(\.turnNumber))
            #expect(rp.match.first.user.username == a.username && rp.moves.allSatisfy { [a.username, b.username].contains($0.player.username) })
            #expect(rp.moves.map(\.steps) == played.map(\.steps))
            #expect(rp.moves.map(\.placement.cells) == played.map(\.placement.cells))
            #expect(rp.dealtShapes.count == played.count && rp.dealtShapes.first == m.nextShape)
            #expect(rp.initialBoard.shapes.isEmpty && rp.initialBoard.firstAvatar.row == 0)
            // Replaying the moves through the rules reproduces the final board.
            var state = GameState(columns: 9, rows: 9)
            for (i, mv) in rp.moves.enumerated() {
                let input = MoveInput(
                    placement: mv.hasPlacement
                        ? .init(
                            kind: Int(mv.placement.kind.rawValue), anchor: Point(Int(mv.placement.anchor.column), Int(mv.placement.anchor.row)),
                            quarterTurns: Int(mv.placement.quarterTurns))
                        : nil, steps: mv.steps.map { Int($0.rawValue) })
                state = state.applying(try GameRules.validate(input, dealt: Shape(rawValue: Int(rp.dealtShapes[i].rawValue))!, in: state).get())
            }
            #expect(MatchRecord.board(state) == rp.match.board)

            // Rematch: both agree within the window; seats swapped; watchers see it and their streams end.
            var rematch = Matchmaking_V1_RequestRematchRequest()
            rematch.matchId = m.matchId
            let waiting = try await mm.requestRematch(rematch, options: loser.options)
            #expect(waiting.state == .waiting)
            _ = try await env.waitForNotification(winner, kind: .rematchRequest)
            let started = try await mm.requestRematch(rematch, options: winner.options)
            #expect(started.state == .started && started.newMatch.kind == .rematch && started.newMatch.rated)
            #expect(started.newMatch.first.user.userId == b.id && started.newMatch.rematchOfMatchId == m.matchId)
            #expect(try await mm.requestRematch(rematch, options: loser.options).newMatch.matchId == started.newMatch.matchId)
            #expect(await watchA.waitUntilFinished() == nil)
            #expect(await watchB.waitUntilFinished() == nil)
            #expect(try await env.getMatch(m.matchId, a).rematchMatchId == started.newMatch.matchId)

            // A reconnecting watcher of the first match gets the events after its sequence.
            let lastSeen = watchA.all[watchA.all.count - 3].sequence
            let again = env.watch(m.matchId, a, after: lastSeen)
            #expect(await again.waitUntilFinished() == nil)
            #expect(again.all.map(\.sequence) == watchA.all.suffix(2).map(\.sequence))

            // Listing my matches, newest first, with filters.
            var mine = Matchmaking_V1_ListMyMatchesRequest()
            mine.pageSize = 1
            let page1 = try await mm.listMyMatches(mine, options: a.options)
            #expect(page1.matches.map(\.matchId) == [started.newMatch.matchId] && !page1.nextPageToken.isEmpty)
            #expect(page1.matches[0].first.user.username == b.username && page1.matches[0].second.user.username == a.username)
            mine.pageToken = page1.nextPageToken
            #expect(try await mm.listMyMatches(mine, options: a.options).matches.map(\.matchId) == [m.matchId])
            mine.pageToken = "forged"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await mm.listMyMatches(mine, options: a.options) }
        }
    }

    // MARK: Quit, decline, chat

    @Test func quitDeclineAndChat() async throws {
        try await withMatchmaking({ $0.chatLimit = 3 }) { env in
            let (a, b, m) = try await env.friendlyMatch(rated: false)
            let mm = env.mm
            var chat = Matchmaking_V1_SendChatMessageRequest()
            chat.matchId = m.matchId
            chat.text = "hi!"
            chat.idempotencyKey = "c1"
            let sent = try await mm.sendChatMessage(chat, options: a.options)
            #expect(sent.message.seat == .first && sent.message.sender.userId == a.id && !sent.replayed)
            #expect(try await mm.sendChatMessage(chat, options: a.options).replayed)
            // B does not watch: notified through social.
            _ = try await env.waitForNotification(b, kind: .matchChatMessage)
            var badChat = Matchmaking_V1_SendChatMessageRequest()
            badChat.text = String(repeating: "y", count: 201)
            await expectFailure(.invalidArgument, fields: ["match_id", "text", "idempotency_key"]) {
                try await mm.sendChatMessage(badChat, options: a.options)
            }
            for i in 2...3 {
                chat.idempotencyKey = "c\(i)"
                _ = try await mm.sendChatMessage(chat, options: a.options)
            }
            chat.idempotencyKey = "c4"
            let limited = await expectFailure(.resourceExhausted) { try await mm.sendChatMessage(chat, options: a.options) }
            #expect(limited?.retryDelaySeconds != nil)
            #expect(limited?.message.hasPrefix("at most 3 messages per 10 seconds: try again in ") == true, "\(String(describing: limited))")
            var history = Matchmaking_V1_ListChatMessagesRequest()
            history.matchId = m.matchId
            history.pageSize = 2
            let page = try await mm.listChatMessages(history, options: b.options)
            #expect(page.messages.count == 2 && !page.nextPageToken.isEmpty && page.messages[0].messageId == sent.message.messageId)
            history.pageSize = 1000  // clamped to the contract's 200
            #expect(try await mm.listChatMessages(history, options: b.options).messages.count == 3)
            history.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await mm.listChatMessages(history, options: b.options) }
            history.pageSize = 2

            // Quit = loss, unrated here; a retried quit answers the same.
            var quit = Matchmaking_V1_QuitMatchRequest()
            quit.matchId = m.matchId
            let q = try await mm.quitMatch(quit, options: a.options)
            #expect(q.match.outcome.reason == .quit && q.match.outcome.winner == .second && q.match.outcome.loserByForfeit == .first)
            #expect(q.match.outcome.ratingChanges.isEmpty)
            #expect(try await mm.quitMatch(quit, options: a.options).match.outcome.reason == .quit)
            await expectFailure(.failedPrecondition) { try await mm.quitMatch(quit, options: b.options) }
            var stats = Matchmaking_V1_GetPlayerStatsRequest()
            let sa = try await mm.getPlayerStats(stats, options: a.options).stats
            #expect(sa.losses == 1 && sa.quits == 1 && sa.rating.ratedMatches == 0)
            stats.userId = b.id
            #expect(try await mm.getPlayerStats(stats, options: a.options).stats.wins == 1)

            // Replay of an active match is refused; of this one allowed.
            var replay = Matchmaking_V1_GetMatchReplayRequest()
            replay.matchId = m.matchId
            #expect(try await mm.getMatchReplay(replay, options: b.options).moves.isEmpty)

            // Decline: the rematch is over.
            var decline = Matchmaking_V1_DeclineRematchRequest()
            decline.matchId = m.matchId
            var rematch = Matchmaking_V1_RequestRematchRequest()
            rematch.matchId = m.matchId
            _ = try await mm.requestRematch(rematch, options: a.options)
            _ = try await mm.declineRematch(decline, options: b.options)
            await expectFailure(.failedPrecondition) { try await mm.requestRematch(rematch, options: a.options) }
            #expect(try await env.getMatch(m.matchId, a).rematchState == .declined)

            // Chat closes 2 minutes after the end; strangers see nothing; blocked users cannot message.
            env.clock.advance(by: .seconds(121))
            chat.idempotencyKey = "c5"
            await expectFailure(.failedPrecondition) { try await mm.sendChatMessage(chat, options: b.options) }
            // A retry is still answered from its key (no other check runs); the key with another
            // text is refused naming it.
            chat.idempotencyKey = "c1"
            let retried = try await mm.sendChatMessage(chat, options: a.options)
            #expect(retried.replayed && retried.message.messageId == sent.message.messageId)
            chat.text = "something else"
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) { try await mm.sendChatMessage(chat, options: a.options) }
            chat.text = "hi!"
            let stranger = try await env.player("s")
            await expectFailure(.notFound) { try await mm.listChatMessages(history, options: stranger.options) }
            await expectFailure(.permissionDenied) {
                try await mm.getPlayerStats(Matchmaking_V1_GetPlayerStatsRequest.with(user: a.id), options: stranger.options)
            }

            let (c, d, m2) = try await env.friendlyMatch()
            try await env.block(d, c)
            chat.matchId = m2.matchId
            chat.idempotencyKey = "c6"
            await expectFailure(.permissionDenied) { try await mm.sendChatMessage(chat, options: c.options) }
            replay.matchId = m2.matchId
            await expectFailure(.failedPrecondition) { try await mm.getMatchReplay(replay, options: c.options) }
        }
    }

    @Test func aChatNotificationOfEmojiFitsSocialsTitleLimit() async throws {
        try await withMatchmaking { env in
            let (a, b, m) = try await env.friendlyMatch(rated: false)
            // 40 family emoji: 40 characters but 200 Unicode scalars (the most chat allows). The
            // title "Name: text" clipped by characters was > 100 scalars, which social refuses.
            let family = "👨\u{200D}👩\u{200D}👧"
            var chat = Matchmaking_V1_SendChatMessageRequest()
            chat.matchId = m.matchId
            chat.text = String(repeating: family, count: 40)
            chat.idempotencyKey = "emoji"
            _ = try await env.mm.sendChatMessage(chat, options: a.options)
            let n = try await env.waitForNotification(b, kind: .matchChatMessage)
            #expect(n != nil)
            if let n {
                let prefix = a.username.capitalized + ": "
                #expect(FieldRules.length(n.title) <= 100 && n.title.hasPrefix(prefix) && n.title.hasSuffix("…"))
                let kept = n.title.dropFirst(prefix.count).dropLast()
                #expect(!kept.isEmpty && kept.allSatisfy { $0 == Character(family) })  // no emoji cut in half
            }
        }
    }

    /// The random driver through the server: every illegal variation the driver generates is
    /// refused with INVALID_ARGUMENT and changes nothing; the legal move is then accepted.
    @Test func theServerRefusesEveryIllegalMoveOfTheRandomDriver() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a")
            var rng = SeededRandom(seed: 7)
            var refused = 0
            // The dealt shapes are seeded per match by the server, so how many mutants turn out
            // illegal varies: play matches (alternating sizes) until 30 were refused, at most 12.
            let sizes = [(9, 9), (5, 7)]
            for game in 0..<12 where refused < 30 {
                let size = sizes[game % sizes.count]
                var m = try await env.local(a, columns: Int32(size.0), rows: Int32(size.1))
                while m.status == .active && m.turnNumber < 60 {
                    let state = MatchEnv.state(m)
                    let dealt = Shape(rawValue: Int(m.nextShape.rawValue))!
                    let legal = RandomGamesTests.legalMove(state, dealt: dealt, rng: &rng)
                    let mutant = RandomGamesTests.mutate(legal, state, dealt: dealt, rng: &rng)
                    let ok = Oracle.isLegal(
                        state, dealt: dealt, placement: mutant.placement.map { ($0.kind, $0.anchor ?? Point(-99, -99), $0.quarterTurns) },
                        steps: mutant.steps)
                    if !ok {
                        await expectFailure(.invalidArgument) { try await env.mm.submitMove(Self.request(mutant, m), options: a.options) }
                        refused += 1
                        #expect(try await env.getMatch(m.matchId, a).turnNumber == m.turnNumber)
                    }
                    m = try await env.mm.submitMove(Self.request(legal, m), options: a.options).match
                }
            }
            #expect(refused >= 30)
        }
    }

    static func request(_ input: MoveInput, _ m: Matchmaking_V1_Match) -> Matchmaking_V1_SubmitMoveRequest {
        var r = Matchmaking_V1_SubmitMoveRequest()
        r.matchId = m.matchId
        r.turnNumber = m.turnNumber
        if let p = input.placement {
            var sp = Matchmaking_V1_ShapePlacement()
            sp.kind = Matchmaking_V1_ShapeKind(rawValue: Int32(p.kind))
            if let anchor = p.anchor {
                var c = Matchmaking_V1_Cell()
                c.column = Int32(anchor.column)
                c.row = Int32(anchor.row)
                sp.anchor = c
            }
            sp.quarterTurns = Int32(p.quarterTurns)
            r.placement = sp
        }
        r.steps = input.steps.map { Matchmaking_V1_Direction(rawValue: Int32($0)) }
        return r
    }

    // MARK: Local play

    @Test func localPlayBothSeats() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a")
            let mm = env.mm
            var start = Matchmaking_V1_StartLocalMatchRequest()
            start.idempotencyKey = "local-1"
            start.columns = 4
            start.rows = 16
            await expectFailure(.invalidArgument, fields: ["columns", "rows"]) { try await mm.startLocalMatch(start, options: a.options) }
            start.columns = 7
            start.rows = 11
            let first = try await mm.startLocalMatch(start, options: a.options)
            #expect(try await mm.startLocalMatch(start, options: a.options).replayed)
            let m = first.match
            #expect(m.kind == .local && !m.rated && !m.hasTurnDeadline && m.board.columns == 7 && m.board.rows == 11)
            #expect(m.board.firstAvatar.column == 3 && m.board.secondAvatar.row == 10)
            let (moves, final) = try await env.playOut(m, first: a, second: a)
            #expect(final.status == .finished && !moves.isEmpty && final.outcome.ratingChanges.isEmpty)
            var chat = Matchmaking_V1_SendChatMessageRequest()
            chat.matchId = m.matchId
            chat.text = "me"
            chat.idempotencyKey = "x"
            await expectFailure(.failedPrecondition) { try await mm.sendChatMessage(chat, options: a.options) }
            // Local matches count for no statistics; a rematch starts at once.
            #expect(try await mm.getPlayerStats(Matchmaking_V1_GetPlayerStatsRequest(), options: a.options).stats.matchesPlayed == 0)
            var rematch = Matchmaking_V1_RequestRematchRequest()
            rematch.matchId = m.matchId
            let again = try await mm.requestRematch(rematch, options: a.options)
            #expect(again.state == .started && again.newMatch.kind == .local && again.newMatch.board.columns == 7)
            var quit = Matchmaking_V1_QuitMatchRequest()
            quit.matchId = again.newMatch.matchId
            let q = try await mm.quitMatch(quit, options: a.options)
            #expect(q.match.outcome.reason == .quit && q.match.outcome.winner == .unspecified)
        }
    }

    // MARK: The queue

    @Test func theQueuePairsCloseRatingsAndForgetsClosedStreams() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a"), b = try await env.player("b"), c = try await env.player("c")
            // A leaves by closing its stream: B then waits alone.
            let qa = env.joinQueue(a)
            #expect(await qa.waitFor { $0.first?.state == .searching })
            #expect(qa.all[0].ticketId.isEmpty == false && qa.all[0].windowMinRating == 1450 && qa.all[0].windowMaxRating == 1550)
            await qa.cancel()
            _ = await eventually { env.core.queue.count == 0 }
            #expect(env.core.queue.count == 0)

            // CancelQueue from another connection.
            let qb = env.joinQueue(b)
            #expect(await qb.waitFor { $0.first?.state == .searching })
            var cancel = Matchmaking_V1_CancelQueueRequest()
            #expect(try await env.mm.cancelQueue(cancel, options: b.options).cancelled)
            #expect(await qb.waitUntilFinished() == nil)
            #expect(qb.all.last?.state == .cancelled)
            #expect(try await env.mm.cancelQueue(cancel, options: b.options).cancelled == false)
            cancel.ticketId = "x"
            #expect(try await env.mm.cancelQueue(cancel, options: b.options).cancelled == false)

            // Rejoining supersedes the older stream (the ticket lives on).
            let q1 = env.joinQueue(c)
            #expect(await q1.waitFor { $0.first?.state == .searching })
            let q2 = env.joinQueue(c)
            #expect(await q2.waitFor { $0.first?.state == .searching })
            #expect(await q1.waitUntilFinished() == nil)
            #expect(q1.all.last?.state == .cancelled && q2.all[0].ticketId == q1.all[0].ticketId)

            // Pairing: both streams learn the match; both notified.
            let qa2 = env.joinQueue(a)
            #expect(await qa2.waitUntilFinished() == nil)
            #expect(await q2.waitUntilFinished() == nil)
            let ma = qa2.all.last!, mc = q2.all.last!
            #expect(ma.state == .matched && mc.state == .matched && ma.matchId == mc.matchId)
            #expect(ma.opponent.userId == c.id && mc.opponent.userId == a.id && Set([ma.seat, mc.seat]) == [.first, .second])
            let match = try await env.getMatch(ma.matchId, a)
            #expect(match.kind == .random && match.rated)
            _ = try await env.waitForNotification(a, kind: .matchFound)
            // In a match: no queue.
            let again = env.joinQueue(a)
            #expect(await again.waitUntilFinished()?.code == .failedPrecondition)
        }
    }

    @Test func blockedPlayersAreNeverPaired() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a"), b = try await env.player("b")
            try await env.block(a, b)
            let qa = env.joinQueue(a), qb = env.joinQueue(b)
            #expect(await qa.waitFor { !$0.isEmpty })
            #expect(await qb.waitFor { !$0.isEmpty })
            try await Task.sleep(for: .seconds(1))
            #expect(!qa.isFinished && !qb.isFinished && env.core.queue.count == 2)
            // A third player takes one of them.
            let c = try await env.player("c")
            let qc = env.joinQueue(c)
            #expect(await qc.waitUntilFinished() == nil)
            #expect(qc.all.last?.state == .matched)
            await qa.cancel()
            await qb.cancel()
        }
    }

    @Test func aQueuedPlayerWhoStartsAChallengeMatchLeavesTheQueue() async throws {
        try await withMatchmaking { env in
            let (a, _, _) = try await env.friendlyMatch()  // a now plays a challenge match
            let c = try await env.player("c")
            // a joined before the match started (the join check passed): simulate by queueing
            // a's ticket directly, as a stream that was open when the challenge was accepted.
            let stream = MatchQueue.Stream()
            _ = env.core.queue.join(userID: a.id, rating: 1500, ticketID: "t-a", now: env.clock.nowMilliseconds(), stream: stream)
            let qc = env.joinQueue(c)
            #expect(await qc.waitFor { !$0.isEmpty })
            #expect(await eventually { env.core.queue.ticket(of: a.id) == nil })
            #expect(await stream.next() != nil)  // told CANCELLED
            try await Task.sleep(for: .milliseconds(300))
            #expect(!qc.isFinished && env.core.queue.ticket(of: c.id) != nil)
            await qc.cancel()
        }
    }

    @Test func aPlayerWhoLeavesWhileBeingPairedGetsNoMatchAndTheOtherWaitsOn() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a"), b = try await env.player("b"), c = try await env.player("c")
            let queue = env.core.queue
            // Tickets queued directly (as open JoinQueue streams carry them), so that the writer can
            // be held while the pairing pass takes them and waits to write their match.
            let sa = MatchQueue.Stream(), sb = MatchQueue.Stream(), sc = MatchQueue.Stream()

            // A's stream ends (client closed it) while the pair's match waits for the writer.
            var gate = await env.holdWriter()
            _ = queue.join(userID: a.id, rating: 1500, ticketID: "t-a", now: env.clock.nowMilliseconds(), stream: sa)
            _ = queue.join(userID: b.id, rating: 1500, ticketID: "t-b", now: env.clock.nowMilliseconds(), stream: sb)
            #expect(await eventually { queue.ticket(of: a.id) == nil && queue.ticket(of: b.id) == nil })  // taken to be paired
            sa.finish()
            queue.streamEnded(userID: a.id, stream: sa)
            gate.signal()
            #expect(await eventually { queue.ticket(of: b.id)?.ticketID == "t-b" })  // B waits on, same ticket
            try await Task.sleep(for: .milliseconds(300))
            #expect(try await env.matchCount([a.id, b.id]) == 0)
            #expect(queue.ticket(of: a.id) == nil && sb.isOpen)

            // C cancels (CancelQueue) while being paired with B: cancelled, no match, B waits on.
            gate = await env.holdWriter()
            _ = queue.join(userID: c.id, rating: 1500, ticketID: "t-c", now: env.clock.nowMilliseconds(), stream: sc)
            #expect(await eventually { queue.ticket(of: b.id) == nil && queue.ticket(of: c.id) == nil })
            #expect(try await env.mm.cancelQueue(Matchmaking_V1_CancelQueueRequest(), options: c.options).cancelled)
            gate.signal()
            let told = await sc.next()
            #expect({ if case .cancelled? = told { true } else { false } }())
            #expect(await sc.next() == nil)
            #expect(await eventually { queue.ticket(of: b.id)?.ticketID == "t-b" })
            try await Task.sleep(for: .milliseconds(300))
            #expect(try await env.matchCount([a.id, b.id, c.id]) == 0)
            #expect(queue.ticket(of: c.id) == nil && sb.isOpen)

            // C joins again and, while being paired with B, joins once more (a reconnect): the
            // newer stream carries the ticket, the older one hears CANCELLED, and the pair is
            // made on a later pass with the newer stream.
            gate = await env.holdWriter()
            let sc2 = MatchQueue.Stream(), sc3 = MatchQueue.Stream()
            _ = queue.join(userID: c.id, rating: 1500, ticketID: "t-c2", now: env.clock.nowMilliseconds(), stream: sc2)
            #expect(await eventually { queue.ticket(of: b.id) == nil && queue.ticket(of: c.id) == nil })
            let again = queue.join(userID: c.id, rating: 1500, ticketID: "t-c3", now: env.clock.nowMilliseconds(), stream: sc3)
            #expect(again.ticket?.ticketID == "t-c2")
            gate.signal()
            let superseded = await sc2.next()
            #expect({ if case .cancelled? = superseded { true } else { false } }())
            let matchedB = await sb.next(), matchedC = await sc3.next()
            guard case .matched(let idB, let opponentOfB, _)? = matchedB, case .matched(let idC, _, _)? = matchedC else {
                Issue.record("B and C were not matched: \(String(describing: matchedB)), \(String(describing: matchedC))")
                return
            }
            #expect(idB == idC && opponentOfB.userId == c.id)
            #expect(try await env.matchCount([b.id, c.id]) == 2)
        }
    }

    // MARK: Leaderboard

    @Test func leaderboardTopNAndMyRank() async throws {
        try await withMatchmaking { env in
            let me = try await env.player("me")
            let core = env.core
            // 30 ranked players written as the finish of rated matches would (rows + index).
            var ids: [String] = []
            for i in 0..<30 { ids.append(i == 17 ? me.id : "user-\(i)") }
            let rows = ids
            let updates = try await core.store.write { tx -> [RatingUpdate] in
                var out: [RatingUpdate] = []
                for (i, id) in rows.enumerated() {
                    // Two players tie on rating and deviation: the earlier reach ranks first.
                    let rating = i == 5 || i == 6 ? 1975.0 : 2000.0 - Double(i) * 10
                    let rec = RatingRecord(
                        rating: Glicko2.Rating(rating: rating, deviation: 80, volatility: 0.06), ratedMatches: 10,
                        updatedAt: Int64(1000 + (i == 5 ? 50 : i)),
                        version: 1)
                    try rec.save(tx, userID: id)
                    out.append(RatingUpdate(userID: id, key: rec.key(userID: id), version: 1))
                }
                return out
            }
            core.apply(Effects(events: [], ratings: updates))
            var r = Matchmaking_V1_GetLeaderboardRequest()
            r.pageSize = 10
            let top = try await env.mm.getLeaderboard(r, options: me.options)
            #expect(top.entries.count == 10 && top.rankedPlayers == 30 && top.entries.map(\.rank) == Array(1...10))
            #expect(top.entries[0].user.userId == "user-0")
            let five = top.entries.firstIndex { $0.user.userId == "user-5" }!, six = top.entries.firstIndex { $0.user.userId == "user-6" }!
            #expect(six < five)
            #expect(top.me.rank == 18 && top.me.user.userId == me.id)
            r.pageToken = top.nextPageToken
            let next = try await env.mm.getLeaderboard(r, options: me.options)
            #expect(next.entries.first?.rank == 11 && Set(next.entries.map(\.user.userId)).isDisjoint(with: top.entries.map(\.user.userId)))
            var rating = Matchmaking_V1_GetRatingRequest()
            #expect(try await env.mm.getRating(rating, options: me.options).rank == 18)
            rating.userId = "user-0"
            #expect(try await env.mm.getRating(rating, options: me.options).rank == 1)
            r.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.mm.getLeaderboard(r, options: me.options) }
        }
    }

    // MARK: Upkeep

    @Test func theEventLogPurgeReadsARangeOfFinishedMatches() async throws {
        try await withMatchmaking { env in
            // The plan: a range of the matches_finished index, not a scan of every match.
            let plan = try await env.core.store.read { c in
                try c.query("EXPLAIN QUERY PLAN " + MatchStore.purgeEventLogsSQL, Int64(0), Int64(1)).map {
                    try $0.get("detail", as: String.self)
                }
            }
            #expect(plan.contains { $0.contains("USING INDEX matches_finished") }, "\(plan)")
            #expect(!plan.contains { $0.hasPrefix("SCAN matches") }, "\(plan)")

            // Matches finished at t+100, t+200, t+300 and an active one, each with an event: a purge
            // of [t+150, t+300) empties only the log of the one finished at t+200. (t is now: the
            // service's own hourly purge, which runs at its start, leaves them alone.)
            let ids = (0..<4).map { _ in ULID.make() }
            let t = env.clock.nowMilliseconds()
            try await env.core.store.write { tx in
                for (i, id) in ids.enumerated() {
                    var m = MatchRecord(
                        id: id, kind: .challenge, rated: false, players: ["x", "y"], ratingBefore: [1500, 1500], seed: 1, columns: 9, rows: 9,
                        now: 50, deadline: nil, rematchOf: "")
                    if i < 3 {
                        m.status = .finished
                        m.finishedAt = t + Int64(100 * (i + 1))
                    }
                    try m.insert(tx)
                    try tx.execute("INSERT INTO match_events (match_id, sequence, event) VALUES (?, 1, ?)", id, [UInt8]())
                }
                try MatchStore.purgeEventLogs(tx, finishedFrom: t + 150, before: t + 300)
            }
            let left = try await env.core.store.read { c in
                try ids.map { try c.queryOne("SELECT COUNT(*) AS n FROM match_events WHERE match_id = ?", $0)!.get("n", as: Int.self) }
            }
            #expect(left == [1, 0, 1, 1])
        }
    }

    // MARK: Shutdown

    @Test func shutdownEndsWatchersWithoutPresenceWrites() async throws {
        try await withMatchmaking { env in
            let (a, b, m) = try await env.friendlyMatch()
            let wa = env.watch(m.matchId, a), wb = env.watch(m.matchId, b)
            #expect(await wa.waitFor { !$0.isEmpty })
            #expect(await wb.waitFor { !$0.isEmpty })
            let presence = { @Sendable () async throws -> [Matchmaking_V1_PlayerPresence] in
                try await env.core.store.read { c in
                    try MatchStore.events(c, matchID: m.matchId, after: 0, through: .max).compactMap {
                        if case .presence(let p)? = $0.event { p } else { nil }
                    }
                }
            }
            #expect(await eventually { (try? await presence().count) == 2 })  // both connected
            env.core.shutDownStreams()
            #expect(await wa.waitUntilFinished()?.code == .unavailable)
            #expect(await wb.waitUntilFinished()?.code == .unavailable)
            // No write raced the database's close: no "disconnected" presence was started.
            try await Task.sleep(for: .milliseconds(500))
            #expect(try await presence().allSatisfy(\.connected))
        }
    }

    // MARK: Account deletion

    @Test func eraseUserEndsMatchesAndAnonymises() async throws {
        try await withMatchmaking { env in
            let (a, b, m) = try await env.friendlyMatch()
            let (_, final) = try await env.playOut(m, first: a, second: b)
            var rematch = Matchmaking_V1_RequestRematchRequest()
            rematch.matchId = m.matchId
            _ = try await env.mm.requestRematch(rematch, options: a.options)
            let active = try await env.mm.requestRematch(rematch, options: b.options).newMatch
            let pending = try await env.challenge(a, b)
            _ = try await env.local(a)
            let watcher = env.watch(active.matchId, b)
            #expect(await watcher.waitFor { !$0.isEmpty })

            var bad = Matchmaking_V1_EraseUserRequest()
            await expectFailure(.invalidArgument, fields: ["event_id", "user_id"]) { try await env.internalAPI.eraseUser(bad) }
            await expectFailure(.permissionDenied, "not through the gateway") {
                try await Matchmaking_V1_MatchmakingInternalClient(env.server.gateway).eraseUser(bad)
            }
            bad.eventId = "accounts:erase-1"
            bad.userId = a.id
            #expect(try await env.internalAPI.eraseUser(bad).replayed == false)
            #expect(try await env.internalAPI.eraseUser(bad).replayed == true)

            // The active rematch ended for B (a win, unrated); B's watcher hears it and ends.
            let ended = try await env.getMatch(active.matchId, b)
            #expect(ended.status == .finished && ended.outcome.reason == .accountDeleted && ended.outcome.ratingChanges.isEmpty)
            #expect(ended.outcome.winner == (active.first.user.userId == b.id ? .first : .second))
            #expect(await watcher.waitUntilFinished() == nil)
            // The finished match shows a deleted player; the challenge is gone.
            let old = try await env.getMatch(final.matchId, b)
            #expect(old.first.user.userId.isEmpty && old.first.user.displayName == "Deleted player")
            var list = Matchmaking_V1_ListChallengesRequest()
            list.statuses = [.pending, .accepted]
            #expect(try await env.mm.listChallenges(list, options: b.options).challenges.allSatisfy { $0.challengeId != pending.challengeId })
            var moves = Matchmaking_V1_ListMatchMovesRequest()
            moves.matchId = final.matchId
            #expect(try await env.mm.listMatchMoves(moves, options: b.options).moves.contains { $0.player.displayName == "Deleted player" })
            // Their statistics and rating are gone.
            let left = try await env.core.store.read { c in
                (
                    try c.queryOne("SELECT COUNT(*) AS n FROM ratings WHERE user_id = ?", a.id)!.get("n", as: Int.self),
                    try c.queryOne("SELECT COUNT(*) AS n FROM matches WHERE first_id = ? OR second_id = ?", a.id, a.id)!.get("n", as: Int.self)
                )
            }
            #expect(left.0 == 0 && left.1 == 0)
        }
    }

    @Test func anErasedAccountGetsNoNewMatchNorRating() async throws {
        try await withMatchmaking { env in
            let a = try await env.player("a"), b = try await env.player("b")
            try await env.befriend(a, b)
            var erase = Matchmaking_V1_EraseUserRequest()
            erase.eventId = "accounts:erase-a"
            erase.userId = a.id
            _ = try await env.internalAPI.eraseUser(erase)

            // A's access token is still valid for a while: nothing new is made for A.
            await expectFailure(.unauthenticated) { try await env.local(a) }
            await expectFailure(.unauthenticated) { try await env.challenge(a, b) }
            let qa = env.joinQueue(a)
            #expect(await qa.waitUntilFinished()?.code == .unauthenticated)

            // A ticket of A's that was queued at the moment of erasure: the match's transaction
            // refuses it; A's stream hears CANCELLED, B waits on.
            let queue = env.core.queue
            let sa = MatchQueue.Stream(), sb = MatchQueue.Stream()
            _ = queue.join(userID: a.id, rating: 1500, ticketID: "t-a", now: env.clock.nowMilliseconds(), stream: sa)
            _ = queue.join(userID: b.id, rating: 1500, ticketID: "t-b", now: env.clock.nowMilliseconds(), stream: sb)
            let told = await sa.next()
            #expect({ if case .cancelled? = told { true } else { false } }(), "\(String(describing: told))")
            #expect(await eventually { queue.ticket(of: b.id)?.ticketID == "t-b" && queue.ticket(of: a.id) == nil })
            try await Task.sleep(for: .milliseconds(300))
            #expect(try await env.matchCount([a.id, b.id]) == 0)

            // A rated match that names A (written before any of these checks could refuse it):
            // its end rates nobody and counts nothing for A.
            let id = ULID.make()
            try await env.core.store.write { tx in
                try MatchRecord(
                    id: id, kind: .challenge, rated: true, players: [a.id, b.id], ratingBefore: [1500, 1500], seed: 1, columns: 9, rows: 9,
                    now: env.clock.nowMilliseconds(), deadline: nil, rematchOf: ""
                ).insert(tx)
            }
            var quit = Matchmaking_V1_QuitMatchRequest()
            quit.matchId = id
            let ended = try await env.mm.quitMatch(quit, options: b.options).match
            #expect(ended.outcome.reason == .quit && ended.outcome.ratingChanges.isEmpty)
            let rows = try await env.core.store.read { c in
                (
                    try c.queryOne("SELECT COUNT(*) AS n FROM ratings WHERE user_id IN (?, ?)", a.id, b.id)!.get("n", as: Int.self),
                    try c.queryOne("SELECT COUNT(*) AS n FROM stats WHERE user_id = ?", a.id)!.get("n", as: Int.self)
                )
            }
            #expect(rows.0 == 0 && rows.1 == 0)
        }
    }

    @Test func theAccessPolicy() async throws {
        try await withMatchmaking { env in
            await expectFailure(.unauthenticated) { try await env.mm.getLeaderboard(Matchmaking_V1_GetLeaderboardRequest()) }
            var get = Matchmaking_V1_GetMatchRequest()
            let a = try await env.player("a")
            await expectFailure(.invalidArgument, fields: ["match_id"]) { try await env.mm.getMatch(get, options: a.options) }
            get.matchId = "nope"
            await expectFailure(.notFound, fields: ["match_id"]) { try await env.mm.getMatch(get, options: a.options) }
        }
    }
}

extension Matchmaking_V1_GetPlayerStatsRequest {
    static func with(user: String) -> Self {
        var r = Self()
        r.userId = user
        return r
    }
}

extension MatchEnv {
    /// Occupies matchmaking's single writer (a transaction ahead of every other write) until the
    /// returned gate is signalled. Returns once the writer is held.
    func holdWriter() async -> DispatchSemaphore {
        let gate = DispatchSemaphore(value: 0)
        let held = Mutex(false)
        let store = core.store
        Task {
            try? await store.write { _ in
                held.withLock { $0 = true }
                gate.wait()
            }
        }
        _ = await eventually { held.withLock { $0 } }
        return gate
    }

    /// How many matches `ids` play or played.
    func matchCount(_ ids: [String]) async throws -> Int {
        try await core.store.read { c in
            try ids.reduce(0) { n, id in
                n + (try c.queryOne("SELECT COUNT(*) AS n FROM matches WHERE first_id = ? OR second_id = ?", id, id)!.get("n", as: Int.self))
            }
        }
    }
}
