import Foundation
import Observability
import Prometheus
import Synchronization

/// A database's metrics in the process registry (`ProcessMetrics.registry`, what `GET /metrics`
/// shows), labelled `database` with the owning service's name (`accounts`, …; the file's name
/// without extension for a database opened without a schema): a bounded set, one per process in
/// production.
///
/// Recording is cheap on purpose: a gauge is one relaxed atomic store, a commit's duration one
/// histogram update under an uncontended lock (see docs/observability.md), and the WAL's size is
/// read at most once a second (`walSampleInterval`), never a `stat` per commit.
final class StorageMetrics: Sendable {
    /// From the call to `write` until its commit is durable (and the caller is about to resume):
    /// the wait for the writer, the transaction, `COMMIT` and, in `.full` mode, the group-commit
    /// fsync.
    let commitDuration: DurationHistogram
    /// Jobs queued for the writer thread and not started yet (writes, and the outbox's reads).
    let writeQueueDepth: Gauge
    /// The `-wal` file's size in bytes.
    let walBytes: Gauge
    let walPath: String

    /// The WAL's size is read after a commit at most this often.
    static let walSampleInterval: Duration = .seconds(1)

    init(database: String, path: String) {
        let labels = [("database", database)]
        let registry = ProcessMetrics.registry
        commitDuration = registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(
                metricName: "storage_commit_duration", unitName: "seconds",
                helpText: "Write transactions, from the call until the commit is durable (queue wait, transaction, COMMIT, group-commit fsync)."),
            labels: labels, buckets: ProcessMetrics.latencyBuckets)
        writeQueueDepth = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                metricName: "storage_write_queue_depth", unitName: "", helpText: "Jobs waiting for the database's single writer thread."),
            labels: labels)
        walBytes = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                metricName: "storage_wal", unitName: "bytes",
                helpText: "Size of the database's write-ahead log file (read at most once a second, after a commit)."),
            labels: labels)
        walPath = path + "-wal"
    }

    /// Reads the WAL file's size (0 when there is none: a closed database, or before the first write).
    func sampleWAL() {
        var st = stat()
        walBytes.set(to: stat(walPath, &st) == 0 ? Double(st.st_size) : 0)
    }
}

/// The metrics of one database's outbox, labelled `database` and `destination` (peer service
/// names from the code: bounded). The delivery loop updates the gauges from the query it runs to
/// find its destinations anyway, so they cost nothing per request.
final class OutboxMetrics: Sendable {
    struct Destination: Sendable {
        let backlog: Gauge
        let parked: Gauge
        let oldestAge: Gauge
        let delivered: Counter
        let failed: Counter
        let parkedTotal: Counter
    }

    /// One destination's undelivered events.
    struct Backlog: Sendable, Equatable {
        /// Waiting for delivery (not parked).
        var waiting = 0
        /// Parked (the receiver refused them as wrong; an operator requeues them).
        var parked = 0
        /// The oldest waiting event's `created_at` (Unix ms), nil when none waits.
        var oldestCreatedAt: Int64?
    }

    private let database: String
    private let destinations = Mutex<[String: Destination]>([:])

    static var deliveries: MetricNameDescriptor {
        MetricNameDescriptor(
            metricName: "outbox_deliveries", unitName: "total",
            helpText: "Outbox delivery attempts by result: delivered, failed (retried after a backoff), parked.")
    }
    static var backlog: MetricNameDescriptor {
        MetricNameDescriptor(
            metricName: "outbox_backlog", unitName: "events", helpText: "Undelivered outbox events waiting for delivery (parked ones excluded).")
    }
    static var parked: MetricNameDescriptor {
        MetricNameDescriptor(
            metricName: "outbox_parked", unitName: "events",
            helpText: "Undelivered outbox events parked because the receiver refused them as wrong (operators requeue them).")
    }
    static var oldestAge: MetricNameDescriptor {
        MetricNameDescriptor(
            metricName: "outbox_oldest_event_age", unitName: "seconds",
            helpText: "Age of the oldest outbox event waiting for delivery (0 when none waits).")
    }

    init(database: String) { self.database = database }

    func destination(_ name: String) -> Destination {
        if let known = destinations.withLock({ $0[name] }) { return known }
        let registry = ProcessMetrics.registry
        let labels = [("database", database), ("destination", name)]
        func deliveries(_ result: String) -> Counter {
            registry.makeCounter(descriptor: Self.deliveries, labels: labels + [("result", result)])
        }
        let made = Destination(
            backlog: registry.makeGauge(descriptor: Self.backlog, labels: labels),
            parked: registry.makeGauge(descriptor: Self.parked, labels: labels),
            oldestAge: registry.makeGauge(descriptor: Self.oldestAge, labels: labels),
            delivered: deliveries("delivered"), failed: deliveries("failed"), parkedTotal: deliveries("parked"))
        return destinations.withLock { d in
            if let raced = d[name] { return raced }
            d[name] = made
            return made
        }
    }

    /// Sets the gauges from a count of the undelivered events by destination; a destination seen
    /// before and absent now has nothing left (0).
    func record(_ backlog: [String: Backlog], now: Int64 = Date().unixMilliseconds) {
        let known = destinations.withLock { Set($0.keys) }
        for name in known.union(backlog.keys) {
            let b = backlog[name] ?? Backlog()
            let m = destination(name)
            m.backlog.set(to: Double(b.waiting))
            m.parked.set(to: Double(b.parked))
            m.oldestAge.set(to: b.oldestCreatedAt.map { Double(max(0, now - $0)) / 1000 } ?? 0)
        }
    }
}
