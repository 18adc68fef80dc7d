/// A named schema change. Migrations are applied in the order the code lists them, each in its own
/// transaction, and recorded by name in `schema_migrations`: a name is never reused or edited once
/// shipped, only followed by new ones.
///
/// A migration cannot toggle `PRAGMA foreign_keys` (it runs inside a transaction); a table rebuild
/// uses `PRAGMA defer_foreign_keys = ON` instead.
public struct Migration: Sendable {
    public let name: String
    let apply: @Sendable (Transaction) throws -> Void

    /// A migration written as SQL (several statements allowed).
    public init(name: String, sql: String) {
        self.name = name
        self.apply = { tx in try tx.executeScript(sql) }
    }

    /// A migration written as code, for data changes SQL alone cannot express.
    public init(name: String, _ apply: @escaping @Sendable (Transaction) throws -> Void) {
        self.name = name
        self.apply = apply
    }
}

extension Migration {
    /// The `outbox` table: cross-service effects written in the same transaction as the change and
    /// delivered later by `OutboxDelivery`. Times are Unix milliseconds.
    public static let outbox = Migration(
        name: "storage.outbox.v1",
        sql: """
            CREATE TABLE outbox (
                id INTEGER PRIMARY KEY,
                event_id TEXT NOT NULL UNIQUE,
                destination TEXT NOT NULL,
                kind TEXT NOT NULL,
                payload BLOB NOT NULL,
                created_at INTEGER NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at INTEGER NOT NULL,
                last_error TEXT,
                delivered_at INTEGER
            );
            CREATE INDEX outbox_pending ON outbox(next_attempt_at) WHERE delivered_at IS NULL;
            """
    )

    /// The `inbox_processed` table: event ids a receiver has already applied, so a redelivered
    /// event is applied once (see `Transaction.markProcessedOnce`).
    public static let inbox = Migration(
        name: "storage.inbox.v1",
        sql: """
            CREATE TABLE inbox_processed (
                event_id TEXT PRIMARY KEY NOT NULL,
                processed_at INTEGER NOT NULL
            ) WITHOUT ROWID;
            """
    )

    /// Pending events by destination in id order: each destination's queue is read on its own
    /// (`OutboxDelivery` delivers every destination in order, with its own backoff).
    public static let outboxByDestination = Migration(
        name: "storage.outbox.v2-by-destination",
        sql: "CREATE INDEX outbox_pending_by_destination ON outbox(destination, id) WHERE delivered_at IS NULL"
    )

    /// `parked_at`: an event its receiver keeps refusing as wrong (`OutboxDelivery.parkAfter`) is
    /// parked, so it stops holding up every later event to that destination; operators see it
    /// in `pendingOutbox` and can requeue it (`UPDATE outbox SET parked_at = NULL …`).
    public static let outboxParking = Migration(
        name: "storage.outbox.v3-parking",
        sql: "ALTER TABLE outbox ADD COLUMN parked_at INTEGER"
    )

    /// `trace_context`: the W3C `traceparent` of the span that enqueued the event (null when the
    /// process was not tracing), so that its delivery, however much later, continues that trace
    /// (`OutboxEvent.traceContext`; docs/observability.md, "Traces").
    public static let outboxTraceContext = Migration(
        name: "storage.outbox.v4-trace-context",
        sql: "ALTER TABLE outbox ADD COLUMN trace_context TEXT"
    )
}
