import Contracts
import Synchronization

/// The random-opponent queue of this process, in memory (a ticket lives exactly as long as a
/// JoinQueue stream can carry it; the match it leads to is stored). One ticket per user; each
/// ticket is carried by one open stream (`QueueStream`). The pairing itself is the pure
/// `QueuePairing.plan`; the upkeep loop calls `pass` every tick.
///
/// **No ghosts.** A ticket leaves the queue the moment its stream ends for any reason: the client
/// closed or cancelled it, its connection died (the transport's keepalive PING cancels the stream
/// of a peer that stopped answering), or the server shut down. A ticket that waited out its
/// lifetime expires.
///
/// **Leaving while being paired.** A pair taken out by `pass` stays visible (`pairing`) until its
/// match is written or given up: CancelQueue still finds the ticket, and the transaction that
/// writes the match first claims both streams (`Stream.claim`), refusing the pair when either has
/// ended. A stream that ended (or was cancelled) before the claim gets no match; the other player
/// goes back to the queue with their waiting time kept. After the claim the match stands (CancelQueue
/// answers false: already matched).
final class MatchQueue: Sendable {
    /// What a stream is told.
    enum Update: Sendable {
        /// A periodic or window-change status (SEARCHING).
        case status
        case matched(matchID: String, opponent: Common_V1_UserRef, seat: GameSeat)
        case cancelled
        case expired
    }

    /// One JoinQueue call's mailbox.
    final class Stream: Sendable {
        private struct State {
            var queue: [Update] = []
            var waiter: CheckedContinuation<Update?, Never>?
            var finished = false
            /// A match for this stream is being written (set inside its transaction).
            var claimed = false
        }
        private let state = Mutex(State())

        /// Whether the stream is still open (its client still waits for a match).
        var isOpen: Bool { state.withLock { !$0.finished } }

        /// Called inside the transaction that writes this stream's match: false when the stream has
        /// ended (no match may be made for it); from now on CancelQueue cannot take it back.
        func claim() -> Bool {
            state.withLock { s in
                if s.finished { return false }
                s.claimed = true
                return true
            }
        }

        /// The match was not written after all.
        func unclaim() { state.withLock { $0.claimed = false } }

        /// What `cancelUnlessClaimed` found, decided under one lock (a match written or given back
        /// between two looks cannot make a second ticket).
        enum CancelOutcome {
            /// Ended now with CANCELLED.
            case cancelled
            /// Its match is being written (claimed and not given back): left alone.
            case claimed
            /// Ended already.
            case finished
        }

        /// Ends the stream with CANCELLED unless its match is being written or it ended already.
        func cancelUnlessClaimed() -> CancelOutcome {
            let (outcome, w): (CancelOutcome, CheckedContinuation<Update?, Never>?) = state.withLock { s in
                if s.finished { return (.finished, nil) }
                if s.claimed { return (.claimed, nil) }
                s.finished = true
                if let w = s.waiter {
                    s.waiter = nil
                    return (.cancelled, w)
                }
                s.queue.append(.cancelled)
                return (.cancelled, nil)
            }
            w?.resume(returning: .cancelled)
            return outcome
        }

        func deliver(_ u: Update) {
            let w: CheckedContinuation<Update?, Never>? = state.withLock { s in
                if s.finished { return nil }
                if let w = s.waiter {
                    s.waiter = nil
                    return w
                }
                // A status is only worth one in the queue.
                if case .status = u, case .status? = s.queue.last { return nil }
                s.queue.append(u)
                return nil
            }
            w?.resume(returning: u)
        }

        /// Ends the mailbox: `next` returns nil from now on (after what is queued).
        func finish() {
            let w: CheckedContinuation<Update?, Never>? = state.withLock { s in
                s.finished = true
                defer { s.waiter = nil }
                return s.waiter
            }
            w?.resume(returning: nil)
        }

        /// The next update, nil once finished (or the task was cancelled).
        func next() async -> Update? {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (c: CheckedContinuation<Update?, Never>) in
                    let ready: Update?? = state.withLock { s in
                        if !s.queue.isEmpty { return .some(s.queue.removeFirst()) }
                        if s.finished { return .some(nil) }
                        s.waiter = c
                        return nil
                    }
                    if let ready { c.resume(returning: ready) }
                }
            } onCancel: {
                self.finish()
            }
        }
    }

    struct Ticket: Sendable {
        var number: UInt64
        var ticketID: String
        var userID: String
        var rating: Double
        var joinedAt: Int64
        var stream: Stream
        /// When the last status went out (Unix ms).
        var lastStatusAt: Int64
        /// Half-width of the window in that status.
        var lastHalfWidth: Double
    }

    private struct State {
        /// Tickets waiting for an opponent.
        var byUser: [String: Ticket] = [:]
        /// Tickets taken out by `pass` whose match is being made (back to `byUser` if it is not).
        var pairing: [String: Ticket] = [:]
        var nextNumber: UInt64 = 1
        var closed = false
    }
    private let state = Mutex(State())
    let lifetime: Int64
    let statusEvery: Int64

    init(lifetime: Duration, statusEvery: Duration) {
        self.lifetime = lifetime.milliseconds
        self.statusEvery = statusEvery.milliseconds
    }

    var count: Int { state.withLock { $0.byUser.count } }

    func ticket(of userID: String) -> Ticket? { state.withLock { $0.byUser[userID] } }

    /// What `join` did.
    enum JoinOutcome {
        /// The ticket `stream` now carries.
        case joined(Ticket)
        /// The queue is closed (the process is stopping).
        case closed
        /// The user's ticket was paired and its match is being written this moment: no new
        /// ticket (the user is about to be in a match); asking again shortly tells which.
        case beingMatched

        var ticket: Ticket? { if case .joined(let t) = self { t } else { nil } }
    }

    /// Joins (or reattaches to the user's SEARCHING ticket, keeping its waiting time: the older
    /// stream is told CANCELLED and ends).
    func join(userID: String, rating: Double, ticketID: String, now: Int64, stream: Stream) -> JoinOutcome {
        let (outcome, superseded): (JoinOutcome, Stream?) = state.withLock { s in
            if s.closed { return (.closed, nil) }
            if var existing = s.byUser[userID] {
                let old = existing.stream
                existing.stream = stream
                existing.lastStatusAt = now
                s.byUser[userID] = existing
                return (.joined(existing), old)
            }
            // Being paired, its match not written yet: the older stream ends (CANCELLED), so the
            // pairing gives up on it, and the ticket waits on with this stream. Its match being
            // written already (claimed): no second ticket, which a later pass could pair again.
            if var existing = s.pairing[userID] {
                switch existing.stream.cancelUnlessClaimed() {
                case .cancelled:
                    s.pairing[userID] = nil
                    existing.stream = stream
                    existing.lastStatusAt = now
                    s.byUser[userID] = existing
                    return (.joined(existing), nil)
                case .claimed:
                    return (.beingMatched, nil)
                case .finished:
                    break
                }
            }
            let t = Ticket(
                number: s.nextNumber, ticketID: ticketID, userID: userID, rating: rating, joinedAt: now, stream: stream,
                lastStatusAt: now, lastHalfWidth: QueuePairing.halfWidth(waitedMilliseconds: 0))
            s.nextNumber += 1
            s.byUser[userID] = t
            return (.joined(t), nil)
        }
        if let superseded {
            superseded.deliver(.cancelled)
            superseded.finish()
        }
        return outcome
    }

    /// The stream carrying `userID`'s ticket ended: the ticket leaves the queue at once (unless
    /// a newer stream carries it now).
    func streamEnded(userID: String, stream: Stream) {
        state.withLock { s in
            if let t = s.byUser[userID], t.stream === stream { s.byUser[userID] = nil }
        }
    }

    /// CancelQueue: removes the user's ticket (any, or the one named). True when one was removed
    /// (a ticket being paired too, unless its match is already being written).
    func cancel(userID: String, ticketID: String) -> Bool {
        let (removed, pairing): (Ticket?, Ticket?) = state.withLock { s in
            if let t = s.byUser[userID], ticketID.isEmpty || t.ticketID == ticketID {
                s.byUser[userID] = nil
                return (t, nil)
            }
            if let t = s.pairing[userID], ticketID.isEmpty || t.ticketID == ticketID { return (nil, t) }
            return (nil, nil)
        }
        // A ticket being paired: its ended stream makes the pairing give up on it.
        if let pairing { return pairing.stream.cancelUnlessClaimed() == .cancelled }
        guard let removed else { return false }
        removed.stream.deliver(.cancelled)
        removed.stream.finish()
        return true
    }

    /// Takes tickets out to be paired (the core writes their match, then `paired` or `putBack`).
    private func take(_ users: [String]) -> [Ticket] {
        state.withLock { s in
            users.compactMap { user in
                guard let t = s.byUser.removeValue(forKey: user) else { return nil }
                s.pairing[user] = t
                return t
            }
        }
    }

    /// The match of tickets taken by `pass` was written.
    func paired(_ tickets: [Ticket]) {
        state.withLock { s in
            for t in tickets where s.pairing[t.userID]?.number == t.number { s.pairing[t.userID] = nil }
        }
    }

    /// Returns tickets taken by `pass` whose match was not made. A ticket whose stream ended
    /// meanwhile (closed, cancelled) is not returned: it is gone.
    func putBack(_ tickets: [Ticket]) {
        state.withLock { s in
            for t in tickets {
                if s.pairing[t.userID]?.number == t.number { s.pairing[t.userID] = nil }
                if s.byUser[t.userID] == nil && !s.closed && t.stream.isOpen { s.byUser[t.userID] = t }
            }
        }
    }

    /// Statuses due (window widened, or `statusEvery` passed) and expiries, at `now`.
    func upkeep(now: Int64) {
        var statuses: [Stream] = []
        var expired: [Stream] = []
        state.withLock { s in
            for (user, var t) in s.byUser {
                let waited = now - t.joinedAt
                if waited >= lifetime {
                    s.byUser[user] = nil
                    expired.append(t.stream)
                    continue
                }
                let half = QueuePairing.halfWidth(waitedMilliseconds: waited)
                if half != t.lastHalfWidth || now - t.lastStatusAt >= statusEvery {
                    t.lastHalfWidth = half
                    t.lastStatusAt = now
                    s.byUser[user] = t
                    statuses.append(t.stream)
                }
            }
        }
        for st in statuses { st.deliver(.status) }
        for st in expired {
            st.deliver(.expired)
            st.finish()
        }
    }

    /// One pairing pass: the pairs to make (taken out of the queue) and the pairs whose
    /// relationship must be asked before they can be paired.
    func pass(now: Int64, neighbors: Int, blocked: QueuePairing.BlockLookup) -> (pairs: [(Ticket, Ticket)], unknown: [(String, String)]) {
        let tickets = state.withLock { s in Array(s.byUser.values) }
        guard tickets.count >= 2 else { return ([], []) }
        let plan = QueuePairing.plan(
            tickets.map { QueuePairing.Ticket(id: $0.number, userID: $0.userID, rating: $0.rating, joinedAt: $0.joinedAt) },
            now: now, neighbors: neighbors, blocked: blocked)
        var pairs: [(Ticket, Ticket)] = []
        for p in plan.pairs {
            let taken = take([tickets[p.first].userID, tickets[p.second].userID])
            if taken.count == 2 {
                // Still the same tickets (not cancelled and rejoined meanwhile).
                if taken[0].number == tickets[p.first].number && taken[1].number == tickets[p.second].number {
                    pairs.append((taken[0], taken[1]))
                } else {
                    putBack(taken)
                }
            } else {
                putBack(taken)
            }
        }
        return (pairs, plan.unknown)
    }

    /// Ends every stream (server shutting down; a pair being written whose stream ended first gets
    /// no match) and refuses new tickets.
    func shutDown() {
        let all: [Ticket] = state.withLock { s in
            s.closed = true
            defer { s.byUser = [:] }
            return Array(s.byUser.values) + Array(s.pairing.values)
        }
        for t in all { t.stream.finish() }
    }

    /// Removes `userID`'s ticket (account erased): its stream is told CANCELLED.
    func remove(userID: String) { _ = cancel(userID: userID, ticketID: "") }
}
