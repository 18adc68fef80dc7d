import Foundation
import Logging
import RPCCore
import ServiceKitTesting
import Storage
import Synchronization
import Testing

@testable import ServiceKit

/// CommitOrder: what committed writes produce reaches subscribers in commit order, once, and
/// never from a rolled-back write.
@Suite struct CommitOrderTests {
    final class Released: Sendable {
        let items = Mutex<[Int64]>([])
    }

    @Test func ticketsAreReleasedInOrderAndAFailedOneReleasesNothingWithoutBlocking() {
        let released = Released()
        let order = CommitOrder<Int64> { batch in released.items.withLock { $0 += batch } }
        let t1 = order.reserve(), t2 = order.reserve(), t3 = order.reserve()
        order.complete(t3, [3])
        order.complete(t2, [2, 22])
        #expect(released.items.withLock { $0 }.isEmpty && order.outstanding == 3)  // t1 outstanding
        order.complete(t1, [])  // its transaction failed
        #expect(released.items.withLock { $0 } == [2, 22, 3] && order.outstanding == 0)
    }

    @Test func concurrentWritersPublishInCommitOrderAndRolledBackWritesPublishNothing() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try StoreTests.open(dir)
        defer { store.database.close() }
        try await store.write { tx in try tx.execute("CREATE TABLE log (n INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)") }
        let released = Released()
        let order = CommitOrder<Int64> { batch in released.items.withLock { $0 += batch } }
        // 64 writers: each inserts a row and publishes the row's id (commit order = id order);
        // every fifth fails after producing its item (its row and item must vanish).
        await withTaskGroup(of: Void.self) { group in
            for i in 0..<64 {
                group.addTask {
                    _ = try? await store.write(publishing: order) { tx, items in
                        try tx.execute("INSERT INTO log (v) VALUES (?)", "w\(i)")
                        items.append(tx.lastInsertRowID)
                        if i % 5 == 0 { throw RPCError(.aborted, "rolled back on purpose") }
                    }
                }
            }
        }
        let committed = try await store.read { c in try c.query("SELECT n FROM log ORDER BY n").map { try $0.get(0, as: Int64.self) } }
        #expect(committed.count == 64 - 13)
        #expect(released.items.withLock { $0 } == committed)
        #expect(order.outstanding == 0)
    }

    @Test func anEventReceivedTwicePublishesOnce() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try StoreTests.open(dir)
        defer { store.database.close() }
        let released = Released()
        let order = CommitOrder<Int64> { batch in released.items.withLock { $0 += batch } }
        let first = try await store.receiveOnce(eventID: "e-1", publishing: order) { _, items in items.append(7) }
        let second = try await store.receiveOnce(eventID: "e-1", publishing: order) { _, items in items.append(8) }
        #expect(!first && second)
        #expect(released.items.withLock { $0 } == [7])
    }
}
