import Foundation
import Logging
import RPCCore
import Synchronization

/// How long a failed event waits before its next attempt: exponential, capped, with jitter so a
/// recovering peer is not hit by every service at the same instant.
public struct OutboxRetryPolicy: Sendable {
    public var initialDelay: Duration
    public var maximumDelay: Duration
    public var multiplier: Double
    /// The fraction of each delay that is random: 0.5 waits between 50 % and 100 % of it.
    public var jitter: Double

    public init(initialDelay: Duration = .seconds(1), maximumDelay: Duration = .seconds(300), multiplier: Double = 2, jitter: Double = 0.5) {
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
        self.multiplier = multiplier
        self.jitter = min(max(jitter, 0), 1)
    }

    /// The delay after the `attempts`-th failure (1-based).
    public func delay(afterAttempt attempts: Int) -> Duration {
        let base = initialDelay.inSeconds * pow(multiplier, Double(max(0, attempts - 1)))
        let capped = min(base, maximumDelay.inSeconds)
        let jittered = capped * (1 - jitter * Double.random(in: 0...1))
        return .milliseconds(Int64((jittered * 1000).rounded()))
    }
}

/// Delivers the outbox: picks due events, hands each to `deliver`, marks it delivered on success,
/// and on failure records the error and schedules a retry with backoff. Delivery is at least once
/// (a crash between the peer's acknowledgement and our mark redelivers), so receivers deduplicate
/// by event id (`Transaction.markProcessedOnce`).
///
/// Destinations are delivered concurrently, each in id order. When an event fails, the rest of
/// its destination's due events wait with it (the peer is likely down), so a dead peer costs one
/// attempt per backoff step, not one per event. Run exactly one per database: the process lock
/// makes that one per process.
public final class OutboxDelivery: Sendable {
    public typealias Deliver = @Sendable (OutboxEvent) async throws -> Void

    private let database: Database
    private let retry: OutboxRetryPolicy
    private let pollInterval: Duration
    private let batchSize: Int
    private let logger: Logger
    private let deliver: Deliver
    private let wakeup = WakeSignal()

    public init(
        database: Database,
        retry: OutboxRetryPolicy = OutboxRetryPolicy(),
        pollInterval: Duration = .seconds(5),
        batchSize: Int = 100,
        logger: Logger = Logger(label: "storage.outbox"),
        deliver: @escaping Deliver
    ) {
        self.database = database
        self.retry = retry
        self.pollInterval = pollInterval
        self.batchSize = max(1, batchSize)
        self.logger = logger
        self.deliver = deliver
    }

    /// Delivers until the task is cancelled, then returns. Commits that enqueue events wake it at
    /// once; otherwise it looks again at the next due time or after `pollInterval`. Storage errors
    /// are logged and retried, never thrown.
    public func run() async {
        let wakeup = self.wakeup
        let observer = database.outboxSignal.add { wakeup.signal() }
        defer { database.outboxSignal.remove(observer) }
        while !Task.isCancelled {
            var wait = pollInterval
            do {
                let pass = try await deliverDue()
                if pass.attempted >= batchSize { continue }  // more may be due right now
                if let next = pass.nextDue {
                    let untilNext = Duration.milliseconds(max(0, next.unixMilliseconds - Date().unixMilliseconds))
                    wait = min(wait, untilNext)
                }
            } catch {
                if Task.isCancelled { break }
                logger.error("outbox pass failed", metadata: ["error": "\(error)", "database": "\(database.path)"])
            }
            await wakeup.wait(upTo: wait)
        }
    }

    /// What one pass did.
    public struct Pass: Sendable {
        public var attempted: Int
        public var delivered: Int
        /// When the earliest pending event becomes due, or nil when nothing is pending.
        public var nextDue: Date?
    }

    /// One pass over the events due now.
    @discardableResult
    public func deliverDue() async throws -> Pass {
        let now = Date().unixMilliseconds
        let limit = batchSize
        let due = try await database.readDurable { c in
            try c.query(
                "SELECT \(OutboxEvent.columns) FROM outbox WHERE delivered_at IS NULL AND next_attempt_at <= ? ORDER BY id LIMIT ?",
                now, limit
            ).map(OutboxEvent.init(row:))
        }
        var byDestination: [String: [OutboxEvent]] = [:]
        var order: [String] = []
        for event in due {
            if byDestination[event.destination] == nil { order.append(event.destination) }
            byDestination[event.destination, default: []].append(event)
        }
        let delivered = await withTaskGroup(of: Int.self) { group in
            for destination in order {
                let events = byDestination[destination]!
                group.addTask { await self.deliverInOrder(events) }
            }
            return await group.reduce(0, +)
        }
        let nextDue = try await database.read { c in
            try c.queryOne("SELECT min(next_attempt_at) FROM outbox WHERE delivered_at IS NULL")?.get(0, as: Int64?.self)
        }
        return Pass(attempted: due.count, delivered: delivered, nextDue: nextDue.map(Date.init(unixMilliseconds:)))
    }

    /// Delivers one destination's events in order; stops at the first failure and defers the rest.
    private func deliverInOrder(_ events: [OutboxEvent]) async -> Int {
        var delivered = 0
        for (i, event) in events.enumerated() {
            do {
                try await self.deliver(event)
            } catch {
                if Task.isCancelled { return delivered }  // shutting down: not the peer's fault
                let attempts = event.attempts + 1
                let next = Date().unixMilliseconds + retry.delay(afterAttempt: attempts).milliseconds
                let message = String(String(describing: error).prefix(1000))
                let rest = events[(i + 1)...].map(\.id)
                logger.warning(
                    "outbox delivery failed",
                    metadata: [
                        "event": "\(event.eventID)", "destination": "\(event.destination)", "kind": "\(event.kind)",
                        "attempts": "\(attempts)", "error": "\(message)",
                    ]
                )
                do {
                    try await database.write { tx in
                        try tx.execute(
                            "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                            attempts, next, message, event.id
                        )
                        for id in rest {
                            try tx.execute("UPDATE outbox SET next_attempt_at = max(next_attempt_at, ?) WHERE id = ?", next, id)
                        }
                    }
                } catch {
                    logger.error("cannot record outbox failure", metadata: ["event": "\(event.eventID)", "error": "\(error)"])
                }
                return delivered
            }
            do {
                let now = Date().unixMilliseconds
                try await database.write { tx in
                    try tx.execute("UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, last_error = NULL WHERE id = ?", now, event.id)
                }
                delivered += 1
            } catch {
                // It was delivered but not marked: it will be redelivered, which receivers absorb.
                logger.error("cannot mark outbox event delivered", metadata: ["event": "\(event.eventID)", "error": "\(error)"])
                return delivered
            }
        }
        return delivered
    }
}

/// A wake-up flag a single waiter sleeps on, with a timeout.
final class WakeSignal: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    func signal() {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            if let w = s.waiter {
                s.waiter = nil
                return w
            }
            s.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Returns when signalled (or a signal is pending), after `timeout`, or when cancelled.
    func wait(upTo timeout: Duration) async {
        if state.withLock({ s in defer { s.pending = false }; return s.pending }) { return }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: timeout) }
            group.addTask { await self.waitForSignal() }
            await group.next()
            group.cancelAll()
        }
    }

    private func waitForSignal() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { s -> Bool in
                    if s.pending || Task.isCancelled {
                        s.pending = false
                        return true
                    }
                    s.waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
                defer { s.waiter = nil }
                return s.waiter
            }
            waiter?.resume()
        }
    }
}
