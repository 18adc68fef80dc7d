import Storage
import Synchronization

/// Hands what committed transactions produced to in-memory subscribers **in commit order**, and
/// only once committed: the live side of a write (a notification pushed to open streams, a move
/// to a match's watchers) must not overtake an earlier commit or show what a rollback undid.
///
/// A write takes a ticket as the last step of its transaction body — on the store's single writer
/// thread, so tickets follow commit order — and completes it after the commit with what it
/// produced (nothing when the commit failed). Completed tickets are released strictly in ticket
/// order, each batch passed to `release` under the lock, so releases from two threads never
/// interleave; `release` must be quick (append to a queue, resume a continuation) and must not
/// call back into this object.
///
/// `ServiceStore.write(publishing:)` and `receiveOnce(eventID:publishing:)` do the ticket dance.
public final class CommitOrder<Item: Sendable>: Sendable {
    private struct State {
        var nextTicket: UInt64 = 1
        var nextRelease: UInt64 = 1
        var done: [UInt64: [Item]] = [:]
    }
    private let state = Mutex(State())
    private let release: @Sendable ([Item]) -> Void

    public init(release: @escaping @Sendable ([Item]) -> Void) { self.release = release }

    /// The next ticket. Every ticket must be completed, or every later one waits forever.
    public func reserve() -> UInt64 {
        state.withLock { s in
            defer { s.nextTicket += 1 }
            return s.nextTicket
        }
    }

    /// What ticket `ticket`'s committed transaction produced (empty when it failed); releases every
    /// completed ticket that is next in order.
    public func complete(_ ticket: UInt64, _ items: [Item]) {
        state.withLock { s in
            s.done[ticket] = items
            while let batch = s.done.removeValue(forKey: s.nextRelease) {
                s.nextRelease += 1
                if !batch.isEmpty { release(batch) }
            }
        }
    }

    /// Tickets reserved and not yet released (tests, logs).
    public var outstanding: Int { state.withLock { Int($0.nextTicket - $0.nextRelease) } }
}

extension ServiceStore {
    /// A write whose body also produces items for in-memory subscribers: they reach `order`'s
    /// release after the commit, in commit order, and never when the transaction fails.
    public func write<T: Sendable, Item: Sendable>(
        publishing order: CommitOrder<Item>, _ body: @escaping @Sendable (Transaction, inout [Item]) throws -> T
    ) async throws -> T {
        let ticket = Mutex<UInt64?>(nil)
        do {
            let (result, items) = try await write { tx -> (T, [Item]) in
                var items: [Item] = []
                let r = try body(tx, &items)
                // Last step of the body: the ticket follows commit order.
                if !items.isEmpty { ticket.withLock { $0 = order.reserve() } }
                return (r, items)
            }
            if let t = ticket.withLock({ $0 }) { order.complete(t, items) }
            return result
        } catch {
            if let t = ticket.withLock({ $0 }) { order.complete(t, []) }
            throw error
        }
    }

    /// `receiveOnce` whose effect also produces items for in-memory subscribers (see
    /// `write(publishing:)`). True when the event was seen before (nothing produced then).
    public func receiveOnce<Item: Sendable>(
        eventID: String, publishing order: CommitOrder<Item>, _ effect: @escaping @Sendable (Transaction, inout [Item]) throws -> Void
    ) async throws -> Bool {
        let ticket = Mutex<UInt64?>(nil)
        let produced = Mutex<[Item]>([])
        do {
            let replayed = try await receiveOnce(eventID: eventID) { tx in
                var items: [Item] = []
                try effect(tx, &items)
                let all = items
                produced.withLock { $0 = all }
                if !items.isEmpty { ticket.withLock { $0 = order.reserve() } }
            }
            if let t = ticket.withLock({ $0 }) { order.complete(t, produced.withLock { $0 }) }
            return replayed
        } catch {
            if let t = ticket.withLock({ $0 }) { order.complete(t, []) }
            throw error
        }
    }
}
