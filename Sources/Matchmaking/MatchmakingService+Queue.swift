import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

extension MatchmakingService {
    // MARK: The random queue (E 4.2)

    /// Streams the ticket's status until it is paired, cancelled or expires. The ticket leaves the
    /// queue the moment this stream ends, however it ends (closed, cancelled, connection lost).
    public func joinQueue(
        request: Matchmaking_V1_JoinQueueRequest, responses: ResponseWriter<Matchmaking_V1_JoinQueueResponse>, context: ServerContext
    ) async throws {
        let caller = try core.caller(context)
        let (erased, active, rating) = try await core.store.read { c in
            (
                try MatchStore.isErased(c, caller.userID), try MatchStore.activeNonLocalMatch(c, caller.userID),
                try RatingRecord.load(c, caller.userID).rating.rating
            )
        }
        // An erased account whose access token is still valid joins nothing (the match would be
        // refused anyway).
        if erased { throw MatchStore.callerErased }
        if let active {
            throw RPCError(.failedPrecondition, "you are playing a match (\(active)): finish it before joining the queue")
        }
        // Warms the name cache, so that the match's views can show the caller's name.
        _ = await core.directory.bestEffort(id: caller.userID)
        let stream = MatchQueue.Stream()
        let queue = core.queue
        let ticket: MatchQueue.Ticket
        switch queue.join(userID: caller.userID, rating: rating, ticketID: ULID.make(), now: core.now(), stream: stream) {
        case .joined(let t): ticket = t
        case .closed: throw RPCError(.unavailable, "the server is shutting down: join again in a moment")
        case .beingMatched:
            // A reconnect while the earlier ticket's match is being written: no second ticket.
            throw RPCError(
                .aborted,
                "your earlier ticket was paired and its match is being made right now: join again in a moment (ListMyMatches shows the match once it is made)"
            )
        }
        defer {
            stream.finish()
            queue.streamEnded(userID: caller.userID, stream: stream)
        }
        try await responses.write(status(ticket, state: .searching))
        while let update = await stream.next() {
            switch update {
            case .status:
                guard let current = queue.ticket(of: caller.userID), current.stream === stream else { continue }
                try await responses.write(status(current, state: .searching))
            case .matched(let matchID, let opponent, let seat):
                var r = status(ticket, state: .matched)
                r.matchId = matchID
                r.opponent = opponent
                r.seat = seat.proto
                try await responses.write(r)
                return
            case .cancelled:
                try await responses.write(status(ticket, state: .cancelled))
                return
            case .expired:
                try await responses.write(status(ticket, state: .expired))
                return
            }
        }
    }

    func status(_ t: MatchQueue.Ticket, state: Matchmaking_V1_QueueState) -> Matchmaking_V1_JoinQueueResponse {
        let waited = max(0, core.now() - t.joinedAt)
        let half = QueuePairing.halfWidth(waitedMilliseconds: waited)
        var r = Matchmaking_V1_JoinQueueResponse()
        r.ticketId = t.ticketID
        r.state = state
        r.rating = t.rating
        r.windowMinRating = half.isInfinite ? 0 : max(0, t.rating - half)
        r.windowMaxRating = half.isInfinite ? 10_000 : t.rating + half
        r.waited = Google_Protobuf_Duration(milliseconds: waited)
        r.playersSearching = Int32(core.queue.count)
        return r
    }

    public func cancelQueue(request: Matchmaking_V1_CancelQueueRequest, context: ServerContext) async throws -> Matchmaking_V1_CancelQueueResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let ticket = FieldRules.id(request.ticketId, field: "ticket_id", required: false, into: &errors)
        try errors.throwIfAny()
        var r = Matchmaking_V1_CancelQueueResponse()
        r.cancelled = core.queue.cancel(userID: caller.userID, ticketID: ticket)
        return r
    }
}
