import Foundation
import Logging
import RPCCore
import Synchronization
import Testing

@testable import Storage

@Suite(.serialized) struct OutboxTests {
    struct PeerDown: Error, CustomStringConvertible {
        var description: String { "peer down (test)" }
    }

    static var quiet: Logger {
        var logger = Logger(label: "outbox-test")
        logger.logLevel = .critical
        return logger
    }

    func openDatabase(_ dir: TempDirectory) throws -> Database {
        try Database.openQuiet(
            directory: dir.path, fileName: "o.sqlite",
            migrations: testMigrations + [.outbox, .outboxByDestination, .outboxParking, .outboxTraceContext, .inbox])
    }

    @Test func deliveryRetriesWithBackoffUntilTheClosureSucceeds() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        let clock = ContinuousClock()
        let calls = Mutex<[ContinuousClock.Instant]>([])
        let seenWhileFailing = Mutex<OutboxEvent?>(nil)
        let delivery = OutboxDelivery(
            database: db,
            retry: OutboxRetryPolicy(initialDelay: .milliseconds(25), maximumDelay: .seconds(1), jitter: 0),
            pollInterval: .seconds(30),  // only the commit wake-up and the retry schedule drive it
            logger: Self.quiet
        ) { event in
            let n = calls.withLock {
                $0.append(clock.now); return $0.count
            }
            if n == 3 {
                let pending = try await db.pendingOutbox()
                seenWhileFailing.withLock { $0 = pending.first }
            }
            if n <= 3 { throw PeerDown() }
            #expect(event.eventID == "settle-1")
            #expect(event.payload == [1, 2, 3])
        }
        let runner = Task { await delivery.run() }
        let enqueuedAt = clock.now
        try await db.write { tx in
            try tx.execute("INSERT INTO users (email) VALUES ('a@x')")
            try tx.enqueueOutbox(eventID: "settle-1", destination: "finance", kind: "task.settle", payload: [1, 2, 3])
        }
        let deadline = clock.now + .seconds(10)
        while try await !db.pendingOutbox().isEmpty, clock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        runner.cancel()
        await runner.value  // run() returns promptly once cancelled

        let times = calls.withLock { $0 }
        try #require(times.count == 4)
        #expect(times[0] - enqueuedAt < .seconds(20))  // woken by the commit, not by the 30 s poll (loose: loaded CI)
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        // 25, 50, 100 ms: never early (a millisecond of rounding allowed), growing.
        #expect(gaps[0] >= .milliseconds(24))
        #expect(gaps[1] >= .milliseconds(49))
        #expect(gaps[2] >= .milliseconds(99))
        let failing = try #require(seenWhileFailing.withLock { $0 })
        #expect(failing.attempts == 2)
        #expect(failing.lastError == "peer down (test)")
        #expect(failing.deliveredAt == nil)

        let row = try #require(
            try await db.read { c in try c.queryOne("SELECT attempts, delivered_at, last_error FROM outbox WHERE event_id = 'settle-1'") })
        #expect(try row.get("attempts", as: Int.self) == 4)
        #expect(try row.get("delivered_at", as: Int64?.self) != nil)
        #expect(try row.get("last_error", as: String?.self) == nil)
    }

    @Test func aFailingDestinationHoldsItsQueueButNotTheOthers() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        let calls = Mutex<[String]>([])
        let delivery = OutboxDelivery(database: db, retry: OutboxRetryPolicy(initialDelay: .seconds(60)), logger: Self.quiet) { event in
            calls.withLock { $0.append(event.eventID) }
            if event.destination == "social" { throw PeerDown() }
        }
        try await db.write { tx in
            for i in 1...3 { try tx.enqueueOutbox(eventID: "s\(i)", destination: "social", kind: "notify", payload: []) }
            for i in 1...2 { try tx.enqueueOutbox(eventID: "f\(i)", destination: "finance", kind: "settle", payload: [UInt8(i)]) }
        }
        let pass = try await delivery.deliverDue()
        #expect(pass.attempted == 3)  // s1 (failed), f1, f2; s2 and s3 are not even tried
        #expect(pass.delivered == 2)
        #expect(Set(calls.withLock { $0 }) == ["s1", "f1", "f2"])  // s2, s3 wait behind s1
        let pending = try await db.pendingOutbox()
        #expect(pending.map(\.eventID) == ["s1", "s2", "s3"])
        #expect(pending.map(\.attempts) == [1, 0, 0])
        #expect(pending[0].nextAttemptAt > Date().addingTimeInterval(30))  // the head's backoff holds the rest
        // Nothing is due now: a second pass attempts nothing.
        let again = try await delivery.deliverDue()
        #expect(again.attempted == 0)
        #expect(again.nextDue != nil)
    }

    @Test func rolledBackWritesEnqueueNothingAndEventIDsAreUnique() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        struct Abort: Error {}
        await #expect(throws: Abort.self) {
            try await db.write { tx in
                try tx.enqueueOutbox(eventID: "e1", destination: "social", kind: "k", payload: [])
                throw Abort()
            }
        }
        #expect(try await db.pendingOutbox().isEmpty)
        try await db.write { tx in try tx.enqueueOutbox(eventID: "e1", destination: "social", kind: "k", payload: []) }
        await #expect(throws: StorageError.uniqueViolation(columns: ["outbox.event_id"], index: nil)) {
            try await db.write { tx in try tx.enqueueOutbox(eventID: "e1", destination: "social", kind: "k", payload: []) }
        }
        #expect(try await db.pendingOutbox().count == 1)
    }

    @Test func receiverAppliesARedeliveredEventOnce() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        var firsts: [Bool] = []
        for _ in 0..<3 {
            let first = try await db.write { tx -> Bool in
                guard try tx.markProcessedOnce(eventID: "evt-42") else { return false }
                try tx.execute("INSERT INTO users (email) VALUES ('from-event@x')")
                return true
            }
            firsts.append(first)
        }
        #expect(firsts == [true, false, false])
        #expect(try await db.read { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } == 1)
        // Marking inside a rolled-back transaction does not count.
        struct Abort: Error {}
        _ = try? await db.write { tx in
            _ = try tx.markProcessedOnce(eventID: "evt-43")
            throw Abort()
        }
        #expect(try await db.write { tx in try tx.markProcessedOnce(eventID: "evt-43") })
    }

    @Test func deliveredEventsCanBePurged() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        let delivery = OutboxDelivery(database: db, logger: Self.quiet) { _ in }
        try await db.write { tx in try tx.enqueueOutbox(eventID: "e1", destination: "d", kind: "k", payload: []) }
        #expect(try await delivery.deliverDue().delivered == 1)
        let purged = try await db.write { tx in try tx.purgeDeliveredOutbox(deliveredBefore: Date().addingTimeInterval(1)) }
        #expect(purged == 1)
    }

    @Test func retryPolicyGrowsExponentiallyWithJitterAndACap() {
        let policy = OutboxRetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(300), multiplier: 2, jitter: 0.5)
        for attempt in 1...12 {
            let full = min(pow(2, Double(attempt - 1)), 300)
            for _ in 0..<20 {
                let d = policy.delay(afterAttempt: attempt).inSeconds
                #expect(d >= full * 0.5 - 0.001 && d <= full + 0.001)
            }
        }
        #expect(OutboxRetryPolicy(jitter: 0).delay(afterAttempt: 30) == .seconds(300))
    }

    /// An event its receiver refuses as wrong (INVALID_ARGUMENT …) is parked after `parkAfter`
    /// tries, and the destination's later events go on; a peer that is down is never parked.
    @Test func aPoisonEventIsParkedAndStopsBlockingItsDestination() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        let delivered = Mutex<[String]>([])
        let delivery = OutboxDelivery(
            database: db, retry: OutboxRetryPolicy(initialDelay: .milliseconds(1), maximumDelay: .milliseconds(1), jitter: 0),
            parkAfter: 3, logger: Self.quiet
        ) { event in
            if event.eventID == "poison" { throw RPCError(.invalidArgument, "user_id: required") }
            if event.eventID == "later-down" { throw RPCError(.unavailable, "peer down") }
            delivered.withLock { $0.append(event.eventID) }
        }
        try await db.write { tx in
            try tx.enqueueOutbox(eventID: "first", destination: "social", kind: "k", payload: [])
            try tx.enqueueOutbox(eventID: "poison", destination: "social", kind: "k", payload: [])
            try tx.enqueueOutbox(eventID: "after", destination: "social", kind: "k", payload: [])
            try tx.enqueueOutbox(eventID: "later-down", destination: "tasks", kind: "k", payload: [])
        }
        for _ in 0..<10 {
            try await delivery.deliverDue()
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(delivered.withLock { $0 } == ["first", "after"], "the poison did not hold up 'after'")
        let pending = try await db.pendingOutbox()
        let poison = try #require(pending.first { $0.eventID == "poison" })
        #expect(poison.parkedAt != nil && poison.attempts == 3 && poison.lastError?.contains("user_id") == true)
        let down = try #require(pending.first { $0.eventID == "later-down" })
        #expect(down.parkedAt == nil && down.attempts >= 5, "an unavailable peer is retried, never parked")
    }

    /// Parking counts refusals in a row, not every failed try: an event that waited out a peer
    /// that was down (UNAVAILABLE many times) still gets `parkAfter` refusals before it is parked.
    @Test func triesWhileThePeerWasDownDoNotCountTowardsParking() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try openDatabase(dir)
        defer { db.close() }
        let tries = Mutex(0)
        let delivery = OutboxDelivery(
            database: db, retry: OutboxRetryPolicy(initialDelay: .milliseconds(1), maximumDelay: .milliseconds(1), jitter: 0),
            parkAfter: 3, logger: Self.quiet
        ) { _ in
            let n = tries.withLock {
                $0 += 1; return $0
            }
            if n <= 6 { throw RPCError(.unavailable, "peer down") }
            throw RPCError(.failedPrecondition, "not yet")
        }
        try await db.write { tx in try tx.enqueueOutbox(eventID: "erase-u1", destination: "social", kind: "k", payload: []) }
        func event() async throws -> OutboxEvent { try #require(try await db.pendingOutbox().first) }
        for _ in 0..<8 {  // six UNAVAILABLE, then two refusals
            try await delivery.deliverDue()
            try await Task.sleep(for: .milliseconds(5))
        }
        let waited = try await event()
        #expect(waited.attempts == 8 && waited.parkedAt == nil, "two refusals in a row are not three")
        for _ in 0..<3 {
            try await delivery.deliverDue()
            try await Task.sleep(for: .milliseconds(5))
        }
        let parked = try await db.pendingOutbox().first { $0.eventID == "erase-u1" }
        #expect(parked?.parkedAt != nil)
    }
}
