import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import ServiceKitTesting
import Storage
import Synchronization
import Testing

@testable import ServiceKit

final class Counter: Sendable {
    private let n = Atomic<Int>(0)
    func add() { n.add(1, ordering: .relaxed) }
    var value: Int { n.load(ordering: .relaxed) }
}

/// Defect 3 of issue 11: a bounded pool sheds load at once and skips work nobody waits for.
@Suite struct BlockingPoolTests {
    @Test func aFullPoolRefusesAtOnceWithARetryHint() async throws {
        let pool = BlockingPool(name: "test", threads: 1, maxQueued: 2)
        let release = DispatchSemaphore(value: 0)
        let started = Counter()
        // One runs (blocked), two wait: the pool is full.
        let held = (0..<3).map { _ in
            Task {
                try await pool.run {
                    started.add(); release.wait()
                }
            }
        }
        #expect(await eventually { pool.load == 3 })
        let refused = await expectFailure(.unavailable) { try await pool.run { 1 } }
        #expect((refused?.retryDelaySeconds ?? 0) >= 1)
        for _ in 0..<3 { release.signal() }
        for t in held { try await t.value }
        #expect(started.value == 3)
        #expect(try await pool.run { 42 } == 42)
        await pool.shutdown()
    }

    @Test func jobsWhoseCallerWentAwayAreSkipped() async throws {
        let pool = BlockingPool(name: "test", threads: 1, maxQueued: 10)
        let release = DispatchSemaphore(value: 0)
        let ran = Counter()
        let blocker = Task { try await pool.run { release.wait() } }
        #expect(await eventually { pool.load == 1 })
        let abandoned = Task { try await pool.run { ran.add() } }
        #expect(await eventually { pool.load == 2 })
        abandoned.cancel()
        // NIOThreadPool skips a cancelled job when its turn comes (the caller hears then).
        release.signal()
        try await blocker.value
        await #expect(throws: CancellationError.self) { try await abandoned.value }
        #expect(try await pool.run { 7 } == 7)
        #expect(ran.value == 0, "a cancelled job never ran")
        await pool.shutdown()
    }
}

/// Defect 4 of issue 11, with real gRPC: a peer down for a while, then back.
@Suite(.serialized) struct OutboxOverRPCTests {
    /// A peer's EraseUser that records the event ids it was given, in order.
    final class Seen: Sendable {
        let ids = Mutex<[String]>([])
        /// While set, the peer answers UNAVAILABLE (it is restarting, or its database is away).
        let down = Atomic<Bool>(true)
    }

    struct Receiver: RPCService {
        let seen: Seen
        var serviceName: String { Tasks_V1_TasksInternalMethods.serviceName }
        var methods: [ServerMethod] {
            let seen = self.seen
            return [
                ServerMethod(
                    Tasks_V1_TasksInternalMethods.eraseUser,
                    .unary(Tasks_V1_EraseUserRequest.self, Tasks_V1_EraseUserResponse.self) { r, ctx in
                        guard ctx.isServiceCall else { throw RPCError(.permissionDenied, "not a service") }
                        if seen.down.load(ordering: .acquiring) { throw RPCError(.unavailable, "starting up") }
                        seen.ids.withLock { $0.append(r.eventId) }
                        return Tasks_V1_EraseUserResponse()
                    })
            ]
        }
    }

    @Test func aPeerDownForAWhileGetsEveryEventOnceInOrderAndIsRetriedAtTheBackoffsPace() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        var quiet = Logger(label: "outbox-rpc")
        quiet.logLevel = .critical
        let db = try Database.open(directory: dir.path, fileName: "o.sqlite", migrations: Migration.kit, logger: quiet)
        defer { db.close() }
        // The peer answers UNAVAILABLE for a while (a refused connection is the same to the
        // outbox, and reusing a freed port races other tests for it under load).
        let seen = Seen()
        let peer = try await TestServer(services: [Receiver(seen: seen)], keys: TestTokens().source)
        let port = peer.port

        let attempts = Mutex<[ContinuousClock.Instant]>([])
        let peers = PeerClients { _ in TestServer.peerClient(port: port) }
        let rpc = OutboxSenders.rpc(peers: peers, timeout: .seconds(2)).deliver
        let delivery = OutboxDelivery(
            database: db, retry: OutboxRetryPolicy(initialDelay: .milliseconds(100), maximumDelay: .milliseconds(800), jitter: 0),
            pollInterval: .seconds(30), batchSize: 100, logger: quiet
        ) { event in
            attempts.withLock { $0.append(.now) }
            try await rpc(event)
        }
        // More events than one batch, enqueued in several commits while the peer is down.
        let total = 250
        for chunk in stride(from: 0, to: total, by: 50) {
            try await db.write { tx in
                for i in chunk..<(chunk + 50) {
                    var r = Tasks_V1_EraseUserRequest()
                    r.eventId = String(format: "e%04d", i)
                    r.userId = "u\(i)"
                    try tx.enqueueCall(Tasks_V1_TasksInternalMethods.eraseUser, r, eventID: r.eventId)
                }
            }
        }
        let loop = Task { await delivery.run() }
        let downFor: Duration = .seconds(3)
        try await Task.sleep(for: downFor)
        let triesWhileDown = attempts.withLock { $0.count }
        // 100 ms, 200, 400, 800, 800, …: about 6 tries in 3 s (not one per event, not one per batch).
        #expect(triesWhileDown >= 3 && triesWhileDown <= 8, "\(triesWhileDown) attempts while the peer was down")
        let gaps = attempts.withLock { a in zip(a.dropFirst(), a).map { $0 - $1 } }
        #expect(gaps.allSatisfy { $0 >= .milliseconds(95) }, "never faster than the backoff: \(gaps)")

        // The peer comes back.
        seen.down.store(false, ordering: .releasing)
        #expect(await eventually(timeout: .seconds(20)) { seen.ids.withLock { $0.count } >= total })
        // The loop marks a batch delivered after its call returns: wait for that before stopping
        // it (cancelled in between, the last batch would be sent again on the next start).
        #expect(await eventually(timeout: .seconds(20)) { (try? await db.pendingOutbox().isEmpty) == true })
        loop.cancel()
        await loop.value
        let got = seen.ids.withLock { $0 }
        #expect(got == (0..<total).map { String(format: "e%04d", $0) }, "every event once, in order")
        await peer.stop()
        await peers.close()
    }
}
