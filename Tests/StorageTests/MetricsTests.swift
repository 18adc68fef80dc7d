import Foundation
import Logging
import Observability
import RPCCore
import Synchronization
import Testing

@testable import Storage

/// Issue 19: the storage metrics move as they should. Every test opens a database with
/// a name of its own (the `database` label), since every test in the process shares one registry.
@Suite(.serialized) struct MetricsTests {
    /// A database whose metrics no other test touches.
    static func open(_ dir: TempDirectory, _ prefix: String, options: Database.Options = Database.Options()) throws -> Database {
        let name = "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())"
        return try Database.openQuiet(
            directory: dir.path, fileName: "\(name).sqlite",
            migrations: testMigrations + [.outbox, .outboxByDestination, .outboxParking, .inbox], options: options)
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
}
