import Foundation
import Logging
import Observability
import RPCCore
import Synchronization
import Tracing

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

/// Delivers the outbox: each destination's events strictly in id order, each destination with its
/// own backoff, destinations independently of each other. An event handed to `deliver` is marked
/// delivered when it returns; when it throws, the error is recorded on the event, the event waits
/// `OutboxRetryPolicy.delay`, and every later event of that destination waits behind it (a later
/// event never overtakes an earlier failed one, and a dead peer costs one attempt per backoff
/// step, however many events wait for it). Other destinations are not slowed.
///
/// Delivery is at least once (a crash between the peer's acknowledgement and our mark redelivers,
/// in order), so receivers deduplicate by event id (`Transaction.markProcessedOnce`). Run exactly
/// one per database: the process lock makes that one per process.
public final class OutboxDelivery: Sendable {
    public typealias Deliver = @Sendable (OutboxEvent) async throws -> Void

    private let database: Database
    private let retry: OutboxRetryPolicy
    private let pollInterval: Duration
    private let batchSize: Int
    private let logger: Logger
    private let deliver: Deliver
    private let parkAfter: Int
    /// Refusals in a row per event (by outbox id), counted here: `attempts` counts every failed
    /// try, also the UNAVAILABLE ones of a peer that was down, so parking by it would park an
    /// event at its first refusal after an outage. Any other answer clears the count; a restart
    /// clears all (more chances, never fewer), and so does parking (a requeued event starts over).
    private let refusalsInARow = Mutex<[Int64: Int]>([:])
    private let isPermanent: @Sendable (any Error) -> Bool
    /// Wakes the loop that starts a destination's loop when its first event appears.
    private let supervisorWake = WakeSignal()
    /// One wake-up per destination loop (a commit wakes them all; each then reads its own queue).
    private let destinationWakes = Mutex<[String: WakeSignal]>([:])
    /// Backlog, age of the oldest event and delivery results per destination.
    let metrics: OutboxMetrics

    public init(
        database: Database,
        retry: OutboxRetryPolicy = OutboxRetryPolicy(),
        pollInterval: Duration = .seconds(5),
        batchSize: Int = 100,
        parkAfter: Int = 5,
        isPermanent: @escaping @Sendable (any Error) -> Bool = OutboxDelivery.refusedAsWrong,
        logger: Logger = Logger(label: "storage.outbox"),
        deliver: @escaping Deliver
    ) {
        self.database = database
        self.retry = retry
        self.pollInterval = pollInterval
        self.batchSize = max(1, batchSize)
        self.parkAfter = max(1, parkAfter)
        self.isPermanent = isPermanent
        self.logger = logger
        self.deliver = deliver
        metrics = OutboxMetrics(database: database.metricsName)
    }

    /// A receiver's answer that retrying cannot change: the event itself is wrong for it
    /// (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, DATA_LOSS). After `parkAfter` such
    /// answers in a row (a bug fixed by a quick redeploy gets a few chances) the event is
    /// parked instead of blocking its destination for ever. Unavailable peers, deadlines,
    /// permissions and unimplemented methods are never parked: they get well by themselves or by
    /// configuration, and the events must then arrive in order.
    public static let refusedAsWrong: @Sendable (any Error) -> Bool = { error in
        guard let rpc = error as? RPCError else { return false }
        switch rpc.code {
        case .invalidArgument, .failedPrecondition, .outOfRange, .dataLoss: return true
        default: return false
        }
    }

    /// Delivers until the task is cancelled, then returns: one loop per destination with pending
    /// events (started as destinations appear). Commits that enqueue events wake the loops at
    /// once; a loop in backoff goes back to sleep until its head event is due. Storage errors are
    /// logged and retried, never thrown.
    ///
    /// The loop that finds the destinations also counts their backlog for the metrics (one query),
    /// every `pollInterval`, on every commit that enqueues and after every pass that delivered,
    /// failed or parked: the age of the oldest waiting event is at most `pollInterval` stale.
    public func run() async {
        let observer = database.outboxSignal.add { [self] in wakeAll() }
        defer { database.outboxSignal.remove(observer) }
        await withTaskGroup(of: Void.self) { group in
            var running = Set<String>()
            while !Task.isCancelled {
                do {
                    for destination in try await pendingDestinations() where running.insert(destination).inserted {
                        group.addTask { await self.runDestination(destination) }
                    }
                } catch {
                    if Task.isCancelled { break }
                    logger.error("outbox: cannot list destinations", metadata: ["error": "\(error)", "database": "\(database.path)"])
                }
                await supervisorWake.wait(upTo: pollInterval)
            }
            group.cancelAll()
        }
    }

    private func wakeAll() {
        supervisorWake.signal()
        for w in destinationWakes.withLock({ Array($0.values) }) { w.signal() }
    }

    private func wake(for destination: String) -> WakeSignal {
        destinationWakes.withLock { w in
            if let existing = w[destination] { return existing }
            let new = WakeSignal()
            w[destination] = new
            return new
        }
    }

    /// One destination's loop: deliver what is due in order, then sleep until the head event is
    /// due, a commit wakes it, or `pollInterval`.
    private func runDestination(_ destination: String) async {
        let wake = wake(for: destination)
        while !Task.isCancelled {
            var wait = pollInterval
            do {
                let pass = try await deliverDue(destination: destination)
                // The backlog changed: the supervisor counts it again.
                if pass.attempted > 0 { supervisorWake.signal() }
                if pass.moreDue { continue }
                if let next = pass.nextDue {
                    wait = min(wait, .milliseconds(max(0, next.unixMilliseconds - Date().unixMilliseconds)))
                }
            } catch {
                if Task.isCancelled { break }
                logger.error("outbox pass failed", metadata: ["error": "\(error)", "destination": "\(destination)", "database": "\(database.path)"])
            }
            await wake.wait(upTo: wait)
        }
    }

    /// What one pass did.
    public struct Pass: Sendable {
        /// Events handed to `deliver`.
        public var attempted: Int
        public var delivered: Int
        /// When the earliest waiting event (a destination's head in backoff) becomes due, or nil
        /// when nothing waits.
        public var nextDue: Date?
        /// A full batch went out: more may be due right now.
        var moreDue = false
    }

    /// One pass now over every destination (concurrently), each in order up to its first failure
    /// or waiting event (tests and tools; `run` loops per destination).
    @discardableResult
    public func deliverDue() async throws -> Pass {
        let destinations = try await pendingDestinations()
        let total = try await withThrowingTaskGroup(of: Pass.self) { group in
            for d in destinations { group.addTask { try await self.deliverDue(destination: d) } }
            var total = Pass(attempted: 0, delivered: 0, nextDue: nil)
            for try await p in group {
                total.attempted += p.attempted
                total.delivered += p.delivered
                if let n = p.nextDue { total.nextDue = min(total.nextDue ?? n, n) }
            }
            return total
        }
        if total.attempted > 0 { _ = try await pendingDestinations() }  // the metrics see the pass
        return total
    }

    /// The destinations with events waiting (not parked), sorted; sets the backlog metrics of
    /// every destination on the way (what the query reads anyway: the undelivered rows).
    private func pendingDestinations() async throws -> [String] {
        // The plan of the DISTINCT it replaces: one scan of the pending index, in destination order.
        let backlog = try await database.read { c in
            try c.query(
                """
                SELECT destination, sum(parked_at IS NULL), sum(parked_at IS NOT NULL),
                       min(CASE WHEN parked_at IS NULL THEN created_at END)
                FROM outbox WHERE delivered_at IS NULL GROUP BY destination
                """
            ).reduce(into: [String: OutboxMetrics.Backlog]()) { backlog, row in
                backlog[try row.get(0, as: String.self)] = OutboxMetrics.Backlog(
                    waiting: try row.get(1, as: Int.self), parked: try row.get(2, as: Int.self),
                    oldestCreatedAt: try row.get(3, as: Int64?.self))
            }
        }
        metrics.record(backlog)
        return backlog.filter { $0.value.waiting > 0 }.keys.sorted()
    }

    /// Delivers `destination`'s due events in id order, up to `batchSize`: stops at the first
    /// failure (recorded, with its backoff) or at the first event not due yet. Delivered events
    /// are marked in one write after the run (a crash before it redelivers them, in order).
    func deliverDue(destination: String) async throws -> Pass {
        let limit = batchSize
        // Read on the writer behind the pending group-commit fsync: never deliver a commit a
        // power cut could still take back.
        let head = try await database.readDurable { c in
            try c.query(
                "SELECT \(OutboxEvent.columns) FROM outbox WHERE delivered_at IS NULL AND parked_at IS NULL AND destination = ? ORDER BY id LIMIT ?",
                destination, limit
            ).map(OutboxEvent.init(row:))
        }
        let counters = metrics.destination(destination)
        var pass = Pass(attempted: 0, delivered: 0, nextDue: nil)
        var delivered: [Int64] = []
        var parked: [(id: Int64, attempts: Int, message: String)] = []
        var failure: (event: OutboxEvent, attempts: Int, next: Int64, message: String)?
        for event in head {
            let now = Date().unixMilliseconds
            if event.nextAttemptAt.unixMilliseconds > now {
                pass.nextDue = event.nextAttemptAt
                break
            }
            pass.attempted += 1
            do {
                try await Self.continuingTrace(of: event) { try await deliver(event) }
                counters.delivered.increment()
                delivered.append(event.id)
                _ = refusalsInARow.withLock { $0.removeValue(forKey: event.id) }
            } catch {
                if Task.isCancelled { break }  // shutting down: not the peer's fault
                let attempts = event.attempts + 1
                let refusals = refusalsInARow.withLock { counts -> Int in
                    guard isPermanent(error) else {
                        counts.removeValue(forKey: event.id)
                        return 0
                    }
                    let n = (counts[event.id] ?? 0) + 1
                    if n >= parkAfter { counts.removeValue(forKey: event.id) } else { counts[event.id] = n }
                    return n
                }
                if refusals >= parkAfter {
                    let message = String(String(describing: error).prefix(1000))
                    logger.error(
                        "outbox event parked: its receiver refuses it as wrong; later events go on (requeue: UPDATE outbox SET parked_at = NULL WHERE event_id = …)",
                        metadata: [
                            "event": "\(event.eventID)", "destination": "\(destination)", "kind": "\(event.kind)",
                            "attempts": "\(attempts)", "refusals_in_a_row": "\(refusals)", "error": "\(message)",
                        ])
                    counters.parkedTotal.increment()
                    parked.append((event.id, attempts, message))
                    continue
                }
                let next = Date().unixMilliseconds + retry.delay(afterAttempt: attempts).milliseconds
                let message = String(String(describing: error).prefix(1000))
                logger.warning(
                    "outbox delivery failed",
                    metadata: [
                        "event": "\(event.eventID)", "destination": "\(destination)", "kind": "\(event.kind)",
                        "attempts": "\(attempts)", "error": "\(message)", "retry_in_ms": "\(next - Date().unixMilliseconds)",
                    ]
                )
                counters.failed.increment()
                failure = (event, attempts, next, message)
                pass.nextDue = Date(unixMilliseconds: next)
                break
            }
        }
        pass.delivered = delivered.count
        pass.moreDue = head.count == limit && delivered.count + parked.count == limit
        guard !delivered.isEmpty || failure != nil || !parked.isEmpty else { return pass }
        let deliveredIDs = delivered, parkedEvents = parked, failed = failure.map { ($0.event.id, $0.attempts, $0.next, $0.message) }
        do {
            let now = Date().unixMilliseconds
            try await database.write { tx in
                for id in deliveredIDs {
                    try tx.execute("UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, last_error = NULL WHERE id = ?", now, id)
                }
                for (id, attempts, message) in parkedEvents {
                    try tx.execute("UPDATE outbox SET parked_at = ?, attempts = ?, last_error = ? WHERE id = ?", now, attempts, message, id)
                }
                if let (id, attempts, next, message) = failed {
                    try tx.execute(
                        "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                        attempts, next, message, id)
                }
            }
        } catch {
            // Delivered but not marked: they will be redelivered in order, which receivers absorb.
            logger.error("cannot record outbox delivery", metadata: ["destination": "\(destination)", "error": "\(error)"])
            throw error
        }
        return pass
    }
}

extension OutboxDelivery {
    /// Runs `body` (the event's delivery) with the trace context the event was enqueued in as the
    /// task's current one (`TraceContext.withCurrent`): a traced peer call made there (`TracingClientInterceptor`) is a
    /// span of that trace, child of the span that enqueued the event, however much later. An
    /// event without one (enqueued while not tracing) is delivered as it is.
    static func continuingTrace(of event: OutboxEvent, _ body: () async throws -> Void) async throws {
        guard let text = event.traceContext, let parent = TraceContext.parse(traceparent: text) else { return try await body() }
        try await TraceContext.withCurrent(parent) { try await body() }
    }
}

/// A wake-up flag a single waiter sleeps on, with a timeout.
public final class WakeSignal: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    public init() {}

    public func signal() {
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
    public func wait(upTo timeout: Duration) async {
        if state.withLock({ s in
            defer { s.pending = false }; return s.pending
        }) {
            return
        }
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
