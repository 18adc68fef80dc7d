import Contracts
import RPCCore
import Synchronization

/// The live WatchMatch streams of this process and who is watching (presence). The database's
/// event log is the truth; a stream carries what was committed.
///
/// **Replay, then live, without loss.** A watcher registers first, then reads its snapshot (or
/// the events after its `after_sequence`) from the database, then takes live events. Every event
/// has the match's next sequence number, assigned inside the transaction that wrote it (one
/// writer: sequences follow commit order). Events are published after their commit; two
/// commits may publish in either order, so a watcher drops what it already sent and, when it
/// sees a sequence beyond the next one, first reads the gap from the log. Nothing is skipped,
/// nothing repeated, and nothing a rollback undid is ever published.
///
/// **Bounded.** A subscription queues at most `maxQueued` events (a watcher that stops reading is
/// cut off with RESOURCE_EXHAUSTED and resumes with after_sequence); a user has at most
/// `maxPerUser` open streams (a new one closes their oldest). Waiting is a continuation, never a
/// timer (docs/architecture.md, "Where handlers run"): cancellation wakes it at once.
final class MatchHub: Sendable {
    let maxPerUser: Int
    let maxQueued: Int

    final class Subscription: Sendable {
        let id: UInt64
        let matchID: String
        let userID: String
        /// The seats the watcher plays (both in a local match).
        let seats: [GameSeat]
        let maxQueued: Int

        enum Next: Sendable {
            case events([Matchmaking_V1_WatchMatchResponse])
            case closed(RPCError)
        }
        private struct State {
            var queue: [Matchmaking_V1_WatchMatchResponse] = []
            var waiter: CheckedContinuation<Next, Never>?
            var closed: RPCError?
        }
        private let state = Mutex(State())

        init(id: UInt64, matchID: String, userID: String, seats: [GameSeat], maxQueued: Int) {
            self.id = id
            self.matchID = matchID
            self.userID = userID
            self.seats = seats
            self.maxQueued = maxQueued
        }

        func deliver(_ e: Matchmaking_V1_WatchMatchResponse) {
            let waiter: CheckedContinuation<Next, Never>? = state.withLock { s in
                if s.closed != nil { return nil }
                if let w = s.waiter {
                    s.waiter = nil
                    return w
                }
                if s.queue.count >= maxQueued {
                    s.queue = []
                    s.closed = RPCError(
                        .resourceExhausted, "this stream fell \(maxQueued) events behind: watch again with after_sequence (nothing is lost)")
                    return nil
                }
                s.queue.append(e)
                return nil
            }
            waiter?.resume(returning: .events([e]))
        }

        func close(_ error: RPCError) {
            let waiter: CheckedContinuation<Next, Never>? = state.withLock { s in
                if s.closed == nil { s.closed = error }
                defer { s.waiter = nil }
                return s.waiter
            }
            waiter?.resume(returning: .closed(error))
        }

        func next() async -> Next {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (c: CheckedContinuation<Next, Never>) in
                    let ready: Next? = state.withLock { s in
                        if !s.queue.isEmpty {
                            defer { s.queue = [] }
                            return .events(s.queue)
                        }
                        if let e = s.closed { return .closed(e) }
                        s.waiter = c
                        return nil
                    }
                    if let ready { c.resume(returning: ready) }
                }
            } onCancel: {
                self.close(RPCError(.cancelled, "the client went away"))
            }
        }
    }

    private struct Registry {
        var byMatch: [String: [Subscription]] = [:]
        var byUser: [String: [Subscription]] = [:]
        /// Open streams per (match, seat): presence.
        var watching: [String: [Int]] = [:]
        var nextID: UInt64 = 1
        var closedReason: RPCError?
    }
    private let registry = Mutex(Registry())

    init(maxPerUser: Int, maxQueued: Int) {
        self.maxPerUser = max(1, maxPerUser)
        self.maxQueued = max(8, maxQueued)
    }

    /// Registers a watcher. Returns the subscription and the seats that went from unwatched to
    /// watched (presence to announce).
    func register(matchID: String, userID: String, seats: [GameSeat]) throws -> (Subscription, [GameSeat]) {
        let (sub, evicted, appeared): (Subscription, [Subscription], [GameSeat]) = try registry.withLock { r in
            if let reason = r.closedReason { throw reason }
            let sub = Subscription(id: r.nextID, matchID: matchID, userID: userID, seats: seats, maxQueued: maxQueued)
            r.nextID += 1
            var mine = r.byUser[userID] ?? []
            var evicted: [Subscription] = []
            while mine.count >= maxPerUser { evicted.append(mine.removeFirst()) }
            mine.append(sub)
            r.byUser[userID] = mine
            r.byMatch[matchID, default: []].append(sub)
            var counts = r.watching[matchID] ?? [0, 0]
            var appeared: [GameSeat] = []
            for s in seats {
                if counts[s.index] == 0 { appeared.append(s) }
                counts[s.index] += 1
            }
            r.watching[matchID] = counts
            return (sub, evicted, appeared)
        }
        for old in evicted {
            old.close(RPCError(.resourceExhausted, "closed: a newer WatchMatch stream was opened (at most \(maxPerUser) per user)"))
        }
        return (sub, appeared)
    }

    /// Forgets a watcher; returns the seats nobody watches any more (presence to announce).
    @discardableResult
    func remove(_ sub: Subscription) -> [GameSeat] {
        sub.close(RPCError(.cancelled, "stream ended"))
        return registry.withLock { r in
            guard var list = r.byMatch[sub.matchID], let i = list.firstIndex(where: { $0 === sub }) else { return [] }
            list.remove(at: i)
            r.byMatch[sub.matchID] = list.isEmpty ? nil : list
            if var mine = r.byUser[sub.userID], let j = mine.firstIndex(where: { $0 === sub }) {
                mine.remove(at: j)
                r.byUser[sub.userID] = mine.isEmpty ? nil : mine
            }
            var counts = r.watching[sub.matchID] ?? [0, 0]
            var gone: [GameSeat] = []
            for s in sub.seats {
                counts[s.index] = max(0, counts[s.index] - 1)
                if counts[s.index] == 0 { gone.append(s) }
            }
            r.watching[sub.matchID] = counts == [0, 0] ? nil : counts
            return gone
        }
    }

    /// Whether each seat of `matchID` is watched now (MatchPlayer.connected).
    func connected(_ matchID: String) -> [Bool] {
        registry.withLock { r in (r.watching[matchID] ?? [0, 0]).map { $0 > 0 } }
    }

    /// Whether `userID` watches `matchID` now (chat notifications go to those who do not).
    func isWatching(matchID: String, userID: String) -> Bool {
        registry.withLock { r in r.byMatch[matchID]?.contains { $0.userID == userID } ?? false }
    }

    /// Hands committed events to the watchers of their match.
    func publish(_ events: [MatchEvent]) {
        guard !events.isEmpty else { return }
        var byMatch: [String: [Matchmaking_V1_WatchMatchResponse]] = [:]
        for e in events { byMatch[e.matchID, default: []].append(e.event) }
        for (match, list) in byMatch {
            let subs = registry.withLock { $0.byMatch[match] ?? [] }
            for sub in subs { for e in list { sub.deliver(e) } }
        }
    }

    /// Ends every stream of `userID` (account erased).
    func close(userID: String, _ error: RPCError) {
        for sub in registry.withLock({ $0.byUser[userID] ?? [] }) { sub.close(error) }
    }

    /// Whether `shutDown` ran (the server is stopping: no presence is recorded any more).
    var isClosed: Bool { registry.withLock { $0.closedReason != nil } }

    /// Ends every stream (UNAVAILABLE: the server is shutting down; watchers reconnect with
    /// after_sequence) and refuses new ones.
    func shutDown() {
        let reason = RPCError(.unavailable, "the server is shutting down: watch again with after_sequence")
        let all = registry.withLock { r -> [Subscription] in
            r.closedReason = reason
            return r.byMatch.values.flatMap { $0 }
        }
        for sub in all { sub.close(reason) }
    }
}
