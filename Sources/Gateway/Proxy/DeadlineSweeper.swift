import RPCCore
import Synchronization

/// Enforces the gateway's deadline cap on calls whose client set no deadline, without a timer
/// per call: calls are registered in a table that a background loop sweeps a few times a second,
/// cancelling those past the cap. (An event-loop timer per call costs a heap insert and an O(n)
/// removal on every call; this costs a table insert and removal.) Calls with a client deadline
/// carry it upstream as `grpc-timeout` instead, which the channel enforces precisely.
final class DeadlineSweeper: Sendable {
    /// One watched call.
    final class Watch: Sendable {
        /// Fired when the call passes its deadline; the relay registers how to cancel it.
        let expiry: CallCancellation
        let deadline: ContinuousClock.Instant
        let expired = Atomic<Bool>(false)
        init(expiry: CallCancellation, deadline: ContinuousClock.Instant) {
            self.expiry = expiry
            self.deadline = deadline
        }
        var isExpired: Bool { expired.load(ordering: .acquiring) }
    }

    private let calls = Mutex<[ObjectIdentifier: Watch]>([:])

    /// Watches a call about to start: register its cancellation with `watch.expiry.onCancel`.
    func watch(for limit: Duration) -> Watch {
        let w = Watch(expiry: CallCancellation(), deadline: .now + limit)
        calls.withLock { $0[ObjectIdentifier(w)] = w }
        return w
    }

    func watch(_ call: any RawClientCall, for limit: Duration) -> Watch {
        let w = watch(for: limit)
        w.expiry.onCancel { call.cancel() }
        return w
    }

    /// The call ended: stop watching it, and drop its cancellation (which holds the call).
    func unwatch(_ w: Watch) {
        _ = calls.withLock { $0.removeValue(forKey: ObjectIdentifier(w)) }
        w.expiry.disarm()
    }

    /// Cancels every call past its deadline; returns how many.
    @discardableResult
    func sweep(now: ContinuousClock.Instant = .now) -> Int {
        let due: [Watch] = calls.withLock { table in
            var due: [Watch] = []
            for (key, w) in table where w.deadline <= now {
                due.append(w)
                table[key] = nil
            }
            return due
        }
        for w in due {
            w.expired.store(true, ordering: .releasing)
            w.expiry.cancel()
        }
        return due.count
    }

    var count: Int { calls.withLock { $0.count } }

    /// Sweeps every `interval` until cancelled.
    func run(interval: Duration) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            sweep()
        }
    }
}
