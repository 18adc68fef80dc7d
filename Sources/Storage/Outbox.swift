import Foundation
import Observability
import Synchronization
import Tracing

/// One cross-service effect waiting in (or delivered from) the outbox.
public struct OutboxEvent: Sendable, Hashable {
    /// Local row id: delivery order.
    public var id: Int64
    /// Globally unique id the receiver deduplicates on (`markProcessedOnce`). Deterministic ids
    /// (`"settle-task-42"`) make a retried request enqueue nothing twice.
    public var eventID: String
    /// The peer that must receive it (`"finance"`, `"social"`).
    public var destination: String
    /// What it is, for the delivery closure to route on (`"task.settle"`).
    public var kind: String
    /// The serialized message.
    public var payload: [UInt8]
    public var createdAt: Date
    /// Failed (and, once delivered, successful) delivery attempts.
    public var attempts: Int
    public var nextAttemptAt: Date
    public var lastError: String?
    public var deliveredAt: Date?
    /// Set when the receiver refused it as wrong too often: delivery skips it (operators requeue).
    public var parkedAt: Date?
    /// The `traceparent` of the span that enqueued it (`Migration.outboxTraceContext`): its
    /// delivery is a span of that trace. Nil when the enqueuing process was not tracing.
    public var traceContext: String?

    init(row: Row) throws {
        id = try row.get("id")
        eventID = try row.get("event_id")
        destination = try row.get("destination")
        kind = try row.get("kind")
        payload = try row.get("payload")
        createdAt = Date(unixMilliseconds: try row.get("created_at"))
        attempts = try row.get("attempts")
        nextAttemptAt = Date(unixMilliseconds: try row.get("next_attempt_at"))
        lastError = try row.get("last_error")
        deliveredAt = try row.get("delivered_at", as: Int64?.self).map(Date.init(unixMilliseconds:))
        parkedAt = try row.get("parked_at", as: Int64?.self).map(Date.init(unixMilliseconds:))
        traceContext = try row.get("trace_context")
    }

    static let columns =
        "id, event_id, destination, kind, payload, created_at, attempts, next_attempt_at, last_error, delivered_at, parked_at, trace_context"
}

extension Date {
    init(unixMilliseconds ms: Int64) { self.init(timeIntervalSince1970: Double(ms) / 1000) }
    var unixMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded()) }
}

extension Transaction {
    /// Queues an event for `destination` in this transaction: it is delivered if and only if the
    /// transaction commits. Requires `Migration.outbox` (and `outboxTraceContext`). A duplicate
    /// `eventID` throws `uniqueViolation`.
    ///
    /// The event keeps the trace context of the span that asked for the write (`TraceContext.current`
    /// where `Database.write` was called: the handler's server span when the process traces), so
    /// its delivery continues the trace.
    public func enqueueOutbox(eventID: String, destination: String, kind: String, payload: [UInt8]) throws {
        let now = Date().unixMilliseconds
        let trace = (self.trace ?? TraceContext.current)?.traceparent
        try execute(
            """
            INSERT INTO outbox (event_id, destination, kind, payload, created_at, attempts, next_attempt_at, trace_context)
            VALUES (?, ?, ?, ?, ?, 0, ?, ?)
            """,
            eventID, destination, kind, payload, now, now, trace
        )
        enqueuedOutbox = true
    }

    /// For receivers: records `eventID` as processed and returns true the first time, false when it
    /// was already processed (a redelivery) — apply the event's effect only on true, in this same
    /// transaction. Requires `Migration.inbox`.
    public func markProcessedOnce(eventID: String) throws -> Bool {
        try execute("INSERT OR IGNORE INTO inbox_processed (event_id, processed_at) VALUES (?, ?)", eventID, Date().unixMilliseconds)
        return changes == 1
    }

    /// Deletes delivered events older than `date`; returns how many. Keeps the table small.
    @discardableResult
    public func purgeDeliveredOutbox(deliveredBefore date: Date) throws -> Int {
        try execute("DELETE FROM outbox WHERE delivered_at IS NOT NULL AND delivered_at < ?", date.unixMilliseconds)
        return changes
    }
}

extension Connection {
    /// Undelivered events, oldest first: what an operator looks at when a peer is down.
    public func pendingOutbox(limit: Int = 1000) throws -> [OutboxEvent] {
        try query("SELECT \(OutboxEvent.columns) FROM outbox WHERE delivered_at IS NULL ORDER BY id LIMIT ?", limit).map(OutboxEvent.init(row:))
    }
}

extension Database {
    /// Undelivered events, oldest first (the operator view a service exposes).
    public func pendingOutbox(limit: Int = 1000) async throws -> [OutboxEvent] {
        try await read { c in try c.pendingOutbox(limit: limit) }
    }
}

/// Wakes delivery loops when a write commits new outbox events.
final class OutboxSignal: Sendable {
    private let observers = Mutex<(next: Int, all: [Int: @Sendable () -> Void])>((0, [:]))

    func add(_ observer: @escaping @Sendable () -> Void) -> Int {
        observers.withLock { state in
            state.next += 1
            state.all[state.next] = observer
            return state.next
        }
    }

    func remove(_ id: Int) {
        _ = observers.withLock { $0.all.removeValue(forKey: id) }
    }

    func fire() {
        let all = observers.withLock { Array($0.all.values) }
        for observer in all { observer() }
    }
}
