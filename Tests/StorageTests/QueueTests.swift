import Foundation
import RPCCore
import Synchronization
import Testing

@testable import Storage

/// Issue 11, defect 3: the database threads' queues are bounded, and a job whose caller went away
/// before its turn is skipped.
@Suite struct QueueTests {
    final class Gate: Sendable {
        let open = DispatchSemaphore(value: 0)
        let ran = Mutex<[String]>([])
    }

    @Test func aFullQueueIsRefusedAtOnceAndCancelledJobsAreSkipped() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(
            directory: dir.path, fileName: "q.sqlite", migrations: testMigrations,
            options: Database.Options(readerCount: 1, maxQueuedJobs: 4))
        defer { db.close() }
        let gate = Gate()
        // The one reader is held; four wait behind it; the fifth waiting job is refused at once.
        let blocker = Task { try await db.read { _ in gate.open.wait() } }
        try await Task.sleep(for: .milliseconds(50))
        let waiting = (0..<4).map { i in Task { try await db.read { _ in gate.ran.withLock { $0.append("job\(i)") } } } }
        try await Task.sleep(for: .milliseconds(50))
        await #expect(throws: StorageError.overloaded(queued: 4)) { try await db.read { _ in 1 } }
        #expect(StorageError.overloaded(queued: 4).rpcError.code == .unavailable)

        // Two callers give up (their client went away, or their deadline passed).
        waiting[1].cancel()
        waiting[3].cancel()
        gate.open.signal()
        try await blocker.value
        for (i, t) in waiting.enumerated() {
            if i == 1 || i == 3 {
                await #expect(throws: CancellationError.self) { try await t.value }
            } else {
                try await t.value
            }
        }
        // In either order: the four tasks reach the queue in whatever order they were scheduled.
        #expect(gate.ran.withLock { $0 }.sorted() == ["job0", "job2"], "cancelled jobs never ran")
        // A write cancelled before its turn does not happen either.
        let writeGate = Gate()
        let holder = Task { try await db.write { _ in writeGate.open.wait() } }
        try await Task.sleep(for: .milliseconds(50))
        let skipped = Task { try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES ('never@x')") } }
        try await Task.sleep(for: .milliseconds(50))
        skipped.cancel()
        writeGate.open.signal()
        try await holder.value
        await #expect(throws: CancellationError.self) { try await skipped.value }
        #expect(try await db.read { c in try c.queryOne("SELECT count(*) FROM users WHERE email = 'never@x'")!.get(0, as: Int.self) } == 0)
    }
}
