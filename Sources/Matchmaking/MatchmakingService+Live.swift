import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

extension MatchmakingService {
    // MARK: WatchMatch

    /// Registers first, then reads the snapshot (or the events after `after_sequence`) from the
    /// log, then relays live events, filling any gap from the log (see MatchHub). Ends with OK once
    /// the match is finished and no rematch can follow any more.
    public func watchMatch(
        request: Matchmaking_V1_WatchMatchRequest, responses: ResponseWriter<Matchmaking_V1_WatchMatchResponse>, context: ServerContext
    ) async throws {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let id = Self.matchID(request.matchId, into: &errors)
        if request.afterSequence < 0 { errors.add("after_sequence", "must not be negative") }
        try errors.throwIfAny()
        let first = try await core.store.read { c in try Self.playerMatch(c, id, caller.userID) }
        let seats: [GameSeat] = first.isLocal ? [.first, .second] : [first.seat(of: caller.userID)!]
        let (sub, appeared) = try core.hub.register(matchID: id, userID: caller.userID, seats: seats)
        let core = self.core
        defer {
            // At shutdown every stream ends at once: no write is started then (it would race the
            // database's close); the snapshot after the restart shows who watches.
            let gone = core.hub.remove(sub)
            if !gone.isEmpty && !core.hub.isClosed { Task { await core.announcePresence(matchID: id, seats: gone, connected: false) } }
        }
        if !appeared.isEmpty { await core.announcePresence(matchID: id, seats: appeared, connected: true) }

        // The start: a snapshot, or the missed events when the log still has them all.
        let hub = core.hub
        let start = try await core.store.read { c -> (events: [Matchmaking_V1_WatchMatchResponse], last: Int64, done: Bool) in
            guard let m = try MatchRecord.load(c, id) else { throw FieldErrors.single(.notFound, field: "match_id", "no such match among yours") }
            let done = Self.isOver(m)
            let after = request.afterSequence
            if after > 0, after <= m.lastSequence {
                let events = try MatchStore.events(c, matchID: id, after: after, through: m.lastSequence)
                if events.count == Int(m.lastSequence - after) { return (events, m.lastSequence, done) }
            }
            var e = Matchmaking_V1_WatchMatchResponse()
            e.sequence = m.lastSequence
            e.occurredAt = Google_Protobuf_Timestamp(milliseconds: core.now())
            e.snapshot = try MatchStore.proto(c, m, hub: hub)
            return ([e], m.lastSequence, done)
        }
        for e in start.events { try await responses.write(e) }
        if start.done { return }
        var last = start.last

        while true {
            switch await sub.next() {
            case .closed(let error):
                if error.code == .cancelled { return }
                throw error
            case .events(let events):
                for e in events where e.sequence > last {
                    if e.sequence > last + 1 {
                        let from = last
                        let gap = try await core.store.read { c in try MatchStore.events(c, matchID: id, after: from, through: e.sequence - 1) }
                        for g in gap where g.sequence > last {
                            try await responses.write(g)
                            last = g.sequence
                            if Self.ends(g) { return }
                        }
                    }
                    try await responses.write(e)
                    last = e.sequence
                    if Self.ends(e) { return }
                }
            }
        }
    }

    /// Finished with no rematch to come: nothing more will happen in this match.
    static func isOver(_ m: MatchRecord) -> Bool {
        !m.isActive && (m.rematchState == .started || m.rematchState == .declined || m.windowClosesAt == nil)
    }

    /// The last event of a match's stream: the rematch started or was declined (the window's
    /// close is a DECLINED too). MatchOver itself is followed by the rematch window.
    static func ends(_ e: Matchmaking_V1_WatchMatchResponse) -> Bool {
        switch e.event {
        case .rematch(let u)?: return u.state == .started || u.state == .declined
        case .matchOver(let o)?: return o.outcome.reason == .accountDeleted
        default: return false
        }
    }
}

extension MatchmakingCore {
    /// Presence changes go into the match's log like every event (a reconnecting watcher sees them).
    /// Nothing once the hub is shut down (the server is stopping).
    func announcePresence(matchID: String, seats: [GameSeat], connected: Bool) async {
        guard !hub.isClosed else { return }
        let now = self.now()
        do {
            try await write { tx, effects in
                guard var m = try MatchRecord.load(tx, matchID), !MatchmakingService.isOver(m) else { return }
                for seat in seats {
                    try MatchStore.appendEvent(tx, &m, now: now, effects: &effects) { e in
                        var p = Matchmaking_V1_PlayerPresence()
                        p.seat = seat.proto
                        p.connected = connected
                        e.presence = p
                    }
                }
                try tx.execute("UPDATE matches SET last_sequence = ? WHERE id = ?", m.lastSequence, m.id)
            }
        } catch {
            logger.warning("presence not recorded", metadata: ["match": "\(matchID)", "error": "\(error)"])
        }
    }
}

extension MatchStore {
    /// Logged events `after` < sequence ≤ `through`, in order.
    static func events(_ db: some SQLReader, matchID: String, after: Int64, through: Int64) throws -> [Matchmaking_V1_WatchMatchResponse] {
        try db.query(
            "SELECT event FROM match_events WHERE match_id = ? AND sequence > ? AND sequence <= ? ORDER BY sequence", matchID, after, through
        ).map { try Matchmaking_V1_WatchMatchResponse(serializedBytes: try $0.get("event", as: [UInt8].self)) }
    }
}
