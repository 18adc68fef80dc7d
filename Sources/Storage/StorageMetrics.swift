import Foundation
import Observability
import Prometheus

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
