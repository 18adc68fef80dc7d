import Contracts
import RPCCore
import ServiceKit
import Synchronization

/// The live notification streams of this process (in memory; the inbox in the database is the
/// truth, a stream only carries what was stored).
///
/// **Publication in commit order** (the kit's `CommitOrder`). A write that stores notifications
/// takes a *ticket* as the last step of its transaction body (on the single writer thread, so
/// tickets follow commit order) and, after its commit, hands the notifications over — or nothing,
/// when the commit failed. Tickets are released strictly in order, so two concurrent senders can
/// never reach one subscriber in the opposite order of their ids, and a rolled-back notification
/// is never pushed.
///
/// **A subscription** is a small mailbox: live notifications queue in it (bounded: past
/// `maxQueued` the subscriber is too slow and is cut off with RESOURCE_EXHAUSTED — it reconnects
/// with after_notification_id and misses nothing, the inbox has it all); the stream's handler
/// waits on a continuation (not a timer: see docs/architecture.md "Known gap"), which a
/// publication, a close or the handler's cancellation resumes. At most `maxPerUser` per user:
/// a new one past the bound closes the *oldest* (a phone that changed networks leaves a dead
/// stream behind; the newest is the one in use).
public final class NotificationHub: Sendable {
    public let maxPerUser: Int
    public let maxQueued: Int
    let clock: any WallClock

    private struct Registry {
        var byUser: [String: [Subscription]] = [:]
        var nextID: UInt64 = 1
        var count = 0
        var closedReason: RPCError?
    }
    private final class Locked: Sendable {
        let registry = Mutex(Registry())
        func withLock<R>(_ body: (inout Registry) throws -> R) rethrows -> R { try registry.withLock { try body(&$0) } }
    }
    private let registry = Locked()

    /// Publication in commit order (the kit's `CommitOrder`): writes take tickets, releases
    /// reach the mailboxes in ticket order.
    public let publication: CommitOrder<Delivery>

    /// One notification for one recipient's live streams.
    public struct Delivery: Sendable {
        public var recipient: String
        public var notification: Social_V1_Notification
        public init(recipient: String, notification: Social_V1_Notification) {
            self.recipient = recipient
            self.notification = notification
        }
    }

    public init(maxPerUser: Int, maxQueued: Int, clock: any WallClock) {
        self.maxPerUser = max(1, maxPerUser)
        self.maxQueued = max(1, maxQueued)
        self.clock = clock
        let registry = self.registry
        publication = CommitOrder { batch in
            for d in batch {
                for sub in registry.withLock({ $0.byUser[d.recipient] }) ?? [] { sub.deliver(d.notification) }
            }
        }
    }

    // MARK: Subscriptions

    /// One live stream's mailbox.
    public final class Subscription: Sendable {
        public let id: UInt64
        public let userID: String
        /// The session of the caller's access token: the stream ends when accounts says it ended.
        public let sessionID: String
        /// When the caller's access token expires (Unix ms): the stream ends then (UNAUTHENTICATED).
        public let expiresAt: Int64
        let maxQueued: Int

        public enum Event: Sendable {
            case notifications([Social_V1_Notification])
            case closed(RPCError)
        }
        private struct State {
            var queue: [Social_V1_Notification] = []
            var waiter: CheckedContinuation<Event, Never>?
            var closed: RPCError?
        }
        private let state = Mutex(State())

        init(id: UInt64, userID: String, sessionID: String, expiresAt: Int64, maxQueued: Int) {
            self.id = id
            self.userID = userID
            self.sessionID = sessionID
            self.expiresAt = expiresAt
            self.maxQueued = maxQueued
        }

        /// Queues a notification (or wakes the waiting handler with it). False when the
        /// subscription is closed or overflowed (and is now closed).
        @discardableResult
        func deliver(_ n: Social_V1_Notification) -> Bool {
            let (waiter, event): (CheckedContinuation<Event, Never>?, Event?) = state.withLock { s in
                if s.closed != nil { return (nil, nil) }
                if let w = s.waiter {
                    s.waiter = nil
                    return (w, .notifications([n]))
                }
                if s.queue.count >= maxQueued {
                    s.queue = []
                    s.closed = RPCError(
                        .resourceExhausted,
                        "this stream fell \(maxQueued) notifications behind: subscribe again with after_notification_id (nothing is lost)")
                    return (nil, nil)
                }
                s.queue.append(n)
                return (nil, nil)
            }
            if let waiter, let event { waiter.resume(returning: event) }
            return event != nil || state.withLock { $0.closed == nil }
        }

        /// Ends the stream with `error` (the handler's next `next()` returns it).
        func close(_ error: RPCError) {
            let waiter: CheckedContinuation<Event, Never>? = state.withLock { s in
                if s.closed == nil { s.closed = error }
                let w = s.waiter
                s.waiter = nil
                return w
            }
            waiter?.resume(returning: .closed(error))
        }

        public var isClosed: Bool { state.withLock { $0.closed != nil } }

        /// The next notifications (all queued ones at once), or why the stream ends. Cancelling
        /// the waiting task closes the subscription (client gone, deadline passed).
        public func next() async -> Event {
            if let ready = take() { return ready }
            return await withTaskCancellationHandler {
                await withCheckedContinuation { (c: CheckedContinuation<Event, Never>) in
                    let immediate: Event? = state.withLock { s in
                        if let e = s.closed { return .closed(e) }
                        if !s.queue.isEmpty {
                            defer { s.queue = [] }
                            return .notifications(s.queue)
                        }
                        s.waiter = c
                        return nil
                    }
                    if let immediate { c.resume(returning: immediate) }
                }
            } onCancel: {
                self.close(RPCError.cancelled())
            }
        }

        private func take() -> Event? {
            state.withLock { s in
                if !s.queue.isEmpty {
                    defer { s.queue = [] }
                    return .notifications(s.queue)
                }
                if let e = s.closed { return .closed(e) }
                return nil
            }
        }
    }

    /// Registers a live stream for `userID`, closing the oldest of theirs past `maxPerUser`.
    /// UNAVAILABLE once the hub is shutting down.
    public func register(userID: String, sessionID: String = "", expiresAt: Int64) throws -> Subscription {
        let (sub, evicted): (Subscription, [Subscription]) = try registry.withLock { r in
            if let reason = r.closedReason { throw reason }
            let sub = Subscription(id: r.nextID, userID: userID, sessionID: sessionID, expiresAt: expiresAt, maxQueued: maxQueued)
            r.nextID += 1
            var list = r.byUser[userID] ?? []
            var evicted: [Subscription] = []
            while list.count >= maxPerUser { evicted.append(list.removeFirst()) }
            list.append(sub)
            r.byUser[userID] = list
            r.count += 1 - evicted.count
            return (sub, evicted)
        }
        for old in evicted {
            old.close(
                RPCError(
                    .resourceExhausted,
                    "closed: a newer stream was opened and at most \(maxPerUser) live streams per user are kept"))
        }
        return sub
    }

    /// Forgets a stream (its handler ended).
    public func remove(_ sub: Subscription) {
        sub.close(RPCError.cancelled())
        registry.withLock { r in
            guard var list = r.byUser[sub.userID], let i = list.firstIndex(where: { $0 === sub }) else { return }
            list.remove(at: i)
            r.byUser[sub.userID] = list.isEmpty ? nil : list
            r.count -= 1
        }
    }

    /// Ends every stream of `userID` (their account was deleted).
    public func close(userID: String, _ error: RPCError) {
        for sub in registry.withLock({ $0.byUser[userID] ?? [] }) { sub.close(error) }
    }

    /// Live streams now (tests, logs, the bench).
    public var liveCount: Int { registry.withLock { $0.count } }

    /// Live streams of one user.
    public func liveCount(userID: String) -> Int { registry.withLock { $0.byUser[userID]?.count ?? 0 } }

    // MARK: Publication

    /// Takes the next publication ticket (see `CommitOrder.reserve`).
    public func reserveTicket() -> UInt64 { publication.reserve() }

    /// Completes a ticket (see `CommitOrder.complete`).
    public func complete(ticket: UInt64, notifications: [Delivery]) { publication.complete(ticket, notifications) }

    // MARK: Upkeep

    /// Closes the streams whose access token expired (UNAUTHENTICATED: the client refreshes its
    /// token and subscribes again with after_notification_id). Returns how many.
    @discardableResult
    public func closeExpired() -> Int {
        let now = clock.nowMilliseconds()
        let expired = registry.withLock { r in r.byUser.values.flatMap { $0.filter { $0.expiresAt <= now } } }
        for sub in expired {
            sub.close(
                RPCError(
                    .unauthenticated,
                    "the access token of this stream expired: refresh it and subscribe again with after_notification_id"))
        }
        return expired.count
    }

    /// The distinct sessions of the live streams (for the revocation check).
    public var liveSessionIDs: [String] {
        registry.withLock { r in Array(Set(r.byUser.values.flatMap { $0.map(\.sessionID) }.filter { !$0.isEmpty })) }
    }

    /// Ends the streams of sessions that ended (logged out, revoked, password changed): the
    /// contract's UNAUTHENTICATED "session revoked". Returns how many.
    @discardableResult
    public func closeSessions(_ ended: Set<String>) -> Int {
        guard !ended.isEmpty else { return 0 }
        let subs = registry.withLock { r in r.byUser.values.flatMap { $0.filter { ended.contains($0.sessionID) } } }
        for sub in subs { sub.close(RPCError(.unauthenticated, "the session of this stream was revoked: log in again")) }
        return subs.count
    }

    /// Ends every stream with UNAVAILABLE and refuses new ones (the server is shutting down;
    /// clients reconnect to another instance, or to this one restarted, with after_notification_id).
    public func shutDown() {
        let reason = RPCError(.unavailable, "the server is shutting down: subscribe again with after_notification_id")
        let all = registry.withLock { r -> [Subscription] in
            r.closedReason = reason
            return r.byUser.values.flatMap { $0 }
        }
        for sub in all { sub.close(reason) }
    }
}
