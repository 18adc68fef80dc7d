import RPCCore
import RPCTransport
import Synchronization

/// A streaming relay's upstream call, as the sweeper cancels it.
struct CappedStream: Cancellable {
    let call: any RawClientCall
    func cancel() { call.cancel() }
}

/// Enforces the gateway's deadline cap on calls whose client set no deadline, without a timer
/// per call: calls are queued in start order, one queue per cap, so within a queue deadlines
/// only grow; a background loop sweeps a few times a second, cancelling those past the cap from
/// the front. Ending a call only marks its watch (no search, no removal, no lock on the queue);
/// finished watches leave when they reach the front, or when they pile up behind a long call.
/// Calls with a client deadline carry it upstream as `grpc-timeout` instead, which the channel
/// enforces precisely.
final class DeadlineSweeper: Sendable {
    /// One watched call.
    final class Watch: Sendable {
        let deadline: ContinuousClock.Instant
        private enum State {
            /// The call to cancel at the deadline (nil until the relay has started it).
            case watching((any Cancellable)?)
            case expired
            /// Unwatched: the call ended.
            case done
        }
        private let state = Mutex(State.watching(nil))

        init(deadline: ContinuousClock.Instant) { self.deadline = deadline }

        /// The call to cancel at the deadline; cancelled at once when the deadline already passed.
        func arm(_ call: some Cancellable) {
            let expired = state.withLock { s -> Bool in
                if case .watching = s { s = .watching(call); return false }
                if case .expired = s { return true }
                return false
            }
            if expired { call.cancel() }
        }

        /// Whether the sweeper cancelled the call for passing the cap.
        var isExpired: Bool { state.withLock { if case .expired = $0 { true } else { false } } }

        var isDone: Bool { state.withLock { if case .done = $0 { true } else { false } } }

        /// The call ended: forget it (the call's completion may hold this watch: no cycle stays).
        func finish() { state.withLock { s in if case .watching = s { s = .done } } }

        /// Past the deadline: cancel the call unless it ended.
        func expire() {
            let call = state.withLock { s -> (any Cancellable)? in
                guard case .watching(let c) = s else { return nil }
                s = .expired
                return c
            }
            call?.cancel()
        }
    }

    /// Watches in start order, for one cap.
    private struct Queue {
        let limit: Duration
        var watches: [Watch] = []
    }
    private let queues = Mutex<[Queue]>([])

    /// Watches a call about to start; arm the watch with the call once it exists.
    func watch(for limit: Duration) -> Watch {
        queues.withLock { qs in
            // The deadline is taken under the lock, so each queue stays in deadline order.
            let w = Watch(deadline: .now + limit)
            if let i = qs.firstIndex(where: { $0.limit == limit }) {
                qs[i].watches.append(w)
            } else {
                qs.append(Queue(limit: limit, watches: [w]))
            }
            return w
        }
    }

    func watch(_ call: any RawClientCall, for limit: Duration) -> Watch {
        let w = watch(for: limit)
        w.arm(CappedStream(call: call))
        return w
    }

    /// The call ended: stop watching it, and drop the call it would cancel.
    func unwatch(_ w: Watch) { w.finish() }

    /// Cancels every call past its deadline; returns how many.
    @discardableResult
    func sweep(now: ContinuousClock.Instant = .now) -> Int {
        let due: [Watch] = queues.withLock { qs in
            var due: [Watch] = []
            for i in qs.indices {
                var q = qs[i]
                qs[i].watches = []  // keep `q`'s array unique while it is edited
                // From the front: finished watches go, expired ones are cancelled; the first
                // live watch not yet due ends the pass (every later one is due later).
                var front = 0
                while front < q.watches.count {
                    let w = q.watches[front]
                    if !w.isDone {
                        guard w.deadline <= now else { break }
                        due.append(w)
                    }
                    front += 1
                }
                q.watches.removeFirst(front)
                // Finished watches stuck behind a long call: dropped once they pile up.
                if q.watches.count > 1024 { q.watches.removeAll { $0.isDone } }
                qs[i] = q
            }
            return due
        }
        for w in due { w.expire() }
        return due.count
    }

    /// Calls being watched (finished ones no longer count, whether or not swept away yet).
    var count: Int {
        queues.withLock { qs in qs.reduce(0) { n, q in n + q.watches.count { !$0.isDone } } }
    }

    /// Watches still queued, finished or not (what the sweeper holds in memory).
    var queued: Int { queues.withLock { $0.reduce(0) { $0 + $1.watches.count } } }

    /// Sweeps every `interval` until cancelled.
    func run(interval: Duration) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            sweep()
        }
    }
}
