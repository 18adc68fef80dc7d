import Foundation
import Logging
import Observability
import RPCCore
import Synchronization
import Testing

@testable import Storage

/// Issue 19: the storage and outbox metrics move as they should. Every test opens a database with
/// a name of its own (the `database` label), since every test in the process shares one registry.
@Suite(.serialized) struct MetricsTests {
    struct PeerDown: Error {}

    static var quiet: Logger {
        var logger = Logger(label: "metrics-test")
        logger.logLevel = .critical
        return logger
    }

    /// A database whose metrics no other test touches.
    static func open(_ dir: TempDirectory, _ prefix: String, options: Database.Options = Database.Options()) throws -> Database {
        let name = "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())"
        return try Database.openQuiet(
            directory: dir.path, fileName: "\(name).sqlite",
            migrations: testMigrations + [.outbox, .outboxByDestination, .outboxParking, .outboxTraceContext, .inbox], options: options)
    }

    static func value(_ name: String, _ labels: [(String, String)]) -> Double? {
        ProcessMetrics.sample(name, labels: labels, in: ProcessMetrics.exposition())
    }

    /// Polls until `condition` holds (a loop or a thread has to get there first); false after 10 s.
    static func eventually(_ condition: () throws -> Bool) async throws -> Bool {
        let end = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < end {
            if try condition() { return true }
            try await Task.sleep(for: .milliseconds(5))
        }
        return try condition()
    }

    @Test func everyCommitIsTimedAndNothingElse() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "commits")
        defer { db.close() }
        #expect(db.metricsName.hasPrefix("commits-"))
        let labels = [("database", db.metricsName)]
        func commits() -> Double { Self.value("storage_commit_duration_seconds_count", labels) ?? 0 }
        let before = commits()
        try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES ('a@x')") }
        try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES ('b@x')") }
        try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES ('c@x')") }
        #expect(commits() == before + 3)
        // Rolled back, refused, or only reading: no commit, nothing recorded.
        struct Abort: Error {}
        await #expect(throws: Abort.self) { try await db.write { _ in throw Abort() } }
        await #expect(throws: StorageError.self) { try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES ('a@x')") } }
        _ = try await db.read { c in try c.query("SELECT * FROM users") }
        _ = try await db.pendingOutbox()
        #expect(commits() == before + 3)
        let sum = try #require(Self.value("storage_commit_duration_seconds_sum", labels))
        #expect(sum > 0)
        // The bucket that holds everything holds the three.
        #expect(Self.value("storage_commit_duration_seconds_bucket", labels + [("le", "+Inf")]) == before + 3)
    }

    @Test func theServiceNamesADatabaseOpenedWithItsSchema() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let service = "metrics-service-\(UUID().uuidString.prefix(8).lowercased())"
        let db = try Database.openQuiet(
            directory: dir.path, schema: DatabaseSchema(service: service, fileName: "data.sqlite", migrations: testMigrations))
        defer { db.close() }
        #expect(db.service == service)
        #expect(db.metricsName == service)
        try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES ('a@x')") }
        #expect(Self.value("storage_commit_duration_seconds_count", [("database", service)]) == 1)
    }

    @Test func writesWaitingForTheWriterAreTheQueueDepth() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "queue")
        defer { db.close() }
        let labels = [("database", db.metricsName)]
        func depth() -> Double? { Self.value("storage_write_queue_depth", labels) }
        let gate = DispatchSemaphore(value: 0)
        let started = Mutex(false)
        // The writer is held by one write; three more wait behind it.
        let holder = Task {
            try await db.write { _ in
                started.withLock { $0 = true }
                gate.wait()
            }
        }
        #expect(try await Self.eventually { started.withLock { $0 } })
        #expect(depth() == 0, "the running write does not wait")
        let waiting = (0..<3).map { i in Task { try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES (?)", "w\(i)@x") } } }
        #expect(try await Self.eventually { depth() == 3 })
        gate.signal()
        try await holder.value
        for t in waiting { try await t.value }
        #expect(depth() == 0)
    }

    @Test func theWALSizeIsReadAfterACommitAndAtClose() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "wal")
        let labels = [("database", db.metricsName)]
        func walBytes() -> Double? { Self.value("storage_wal_bytes", labels) }
        func walFileSize() -> Double {
            ((try? FileManager.default.attributesOfItem(atPath: db.path + "-wal"))?[.size] as? NSNumber)?.doubleValue ?? 0
        }
        // The first commit reads the size at once (later ones at most once a second).
        try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES ('a@x')") }
        let afterFirst = try #require(walBytes())
        #expect(afterFirst > 0)
        #expect(afterFirst == walFileSize())
        // Closing checkpoints the WAL and removes it: the gauge says what is left.
        db.close()
        #expect(walBytes() == walFileSize())
        #expect(walBytes() == 0)
    }

    @Test func theBacklogAndItsAgeGrowWhileAPeerIsDownAndClearOnceDelivered() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "backlog")
        defer { db.close() }
        let up = Mutex(false)
        let delivery = OutboxDelivery(database: db, retry: OutboxRetryPolicy(initialDelay: .seconds(60)), logger: Self.quiet) { _ in
            if !up.withLock({ $0 }) { throw PeerDown() }
        }
        let labels = [("database", db.metricsName), ("destination", "social")]
        func metric(_ name: String) -> Double? { Self.value(name, labels) }
        func deliveries(_ result: String) -> Double { Self.value("outbox_deliveries_total", labels + [("result", result)]) ?? 0 }

        try await db.write { tx in
            for i in 1...3 { try tx.enqueueOutbox(eventID: "e\(i)", destination: "social", kind: "notify", payload: []) }
        }
        try await delivery.deliverDue()  // the head fails; the others wait behind it
        #expect(metric("outbox_backlog_events") == 3)
        #expect(deliveries("failed") == 1)
        #expect(deliveries("delivered") == 0)
        let age = try #require(metric("outbox_oldest_event_age_seconds"))
        #expect(age >= 0 && age < 3600)

        // An hour passes (the events are made older): the next look sees the age, not the backlog grow.
        try await db.write { tx in try tx.execute("UPDATE outbox SET created_at = created_at - 3600000") }
        try await db.write { tx in try tx.enqueueOutbox(eventID: "e4", destination: "social", kind: "notify", payload: []) }
        let waiting = try await delivery.deliverDue()
        #expect(waiting.attempted == 0, "the head is still in its backoff")
        #expect(metric("outbox_backlog_events") == 4)
        #expect(try #require(metric("outbox_oldest_event_age_seconds")) >= 3600)

        // The peer is back and the head is due: all four go, the backlog is empty again.
        up.withLock { $0 = true }
        try await db.write { tx in try tx.execute("UPDATE outbox SET next_attempt_at = 0") }
        let pass = try await delivery.deliverDue()
        #expect(pass.delivered == 4)
        #expect(metric("outbox_backlog_events") == 0)
        #expect(metric("outbox_oldest_event_age_seconds") == 0)
        #expect(deliveries("delivered") == 4)
        #expect(deliveries("failed") == 1)
    }

    @Test func parkedEventsLeaveTheBacklogAndAreCounted() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "parked")
        defer { db.close() }
        let delivery = OutboxDelivery(database: db, parkAfter: 1, logger: Self.quiet) { event in
            if event.eventID == "bad" { throw RPCError(.invalidArgument, "no such household") }
        }
        let labels = [("database", db.metricsName), ("destination", "finance")]
        try await db.write { tx in
            try tx.enqueueOutbox(eventID: "bad", destination: "finance", kind: "settle", payload: [])
            try tx.enqueueOutbox(eventID: "good", destination: "finance", kind: "settle", payload: [])
        }
        let pass = try await delivery.deliverDue()
        #expect(pass.delivered == 1)
        #expect(Self.value("outbox_deliveries_total", labels + [("result", "parked")]) == 1)
        #expect(Self.value("outbox_deliveries_total", labels + [("result", "delivered")]) == 1)
        #expect(Self.value("outbox_backlog_events", labels) == 0)
        #expect(Self.value("outbox_parked_events", labels) == 1)
        #expect(Self.value("outbox_oldest_event_age_seconds", labels) == 0, "a parked event is not waiting")
        // Requeued by an operator (due later): it waits again.
        try await db.write { tx in
            try tx.execute("UPDATE outbox SET parked_at = NULL, next_attempt_at = 9999999999999 WHERE event_id = 'bad'")
        }
        #expect(try await delivery.deliverDue().attempted == 0)
        #expect(Self.value("outbox_parked_events", labels) == 0)
        #expect(Self.value("outbox_backlog_events", labels) == 1)
    }

    @Test func theDeliveryLoopKeepsTheMetricsCurrent() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Self.open(dir, "loop")
        defer { db.close() }
        let up = Mutex(false)
        let delivery = OutboxDelivery(
            database: db, retry: OutboxRetryPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(50), jitter: 0),
            pollInterval: .seconds(30),  // only commits, passes and retries drive it
            logger: Self.quiet
        ) { _ in
            if !up.withLock({ $0 }) { throw PeerDown() }
        }
        let labels = [("database", db.metricsName), ("destination", "tasks")]
        func metric(_ name: String) -> Double? { Self.value(name, labels) }
        let runner = Task { await delivery.run() }
        defer { runner.cancel() }
        try await db.write { tx in
            for i in 1...2 { try tx.enqueueOutbox(eventID: "t\(i)", destination: "tasks", kind: "assign", payload: []) }
        }
        // The peer is down: the loop retries, and the backlog shows both events.
        #expect(try await Self.eventually { metric("outbox_backlog_events") == 2 })
        #expect(
            try await Self.eventually { (Self.value("outbox_deliveries_total", labels + [("result", "failed")]) ?? 0) >= 2 },
            "retried after its backoff")
        #expect(metric("outbox_backlog_events") == 2)
        up.withLock { $0 = true }
        #expect(try await Self.eventually { metric("outbox_backlog_events") == 0 })
        #expect(Self.value("outbox_deliveries_total", labels + [("result", "delivered")]) == 2)
        #expect(metric("outbox_oldest_event_age_seconds") == 0)
        runner.cancel()
        await runner.value
    }
}
