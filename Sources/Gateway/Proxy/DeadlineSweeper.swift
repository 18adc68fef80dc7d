import NIOCore
import NIOPosix
import RPCCore
import RPCTransport
import Synchronization

/// Enforces the gateway's deadline cap on calls whose client set no deadline, without a timer
/// per call: calls are queued in start order, one queue per cap, so within a queue deadlines
/// only grow; a background loop sweeps a few times a second, cancelling those past the cap from
/// the front. Ending a call only marks its watch (no search, no removal, no lock on the queue);
/// finished watches leave when they reach the front, or when they pile up behind a long call.
/// Calls with a client deadline carry it upstream as `grpc-timeout` instead, which the channel
/// enforces precisely.
///
/// Each serving loop watches its calls in queues of its own (the loops never wait for each other
/// on one lock); calls from elsewhere share one more set of queues.
final class DeadlineSweeper: Sendable {
    /// One watched call: a `CallCancellation` the sweeper fires at the deadline. Register the
    /// call with `onCancel(cancelling:)` once it exists (at once cancelled if the deadline has
    /// passed), `disarm` it when the call ends (which also drops the call: the call's completion
    /// may hold this watch, so no cycle stays); `isCancelled` says the sweeper cut the call.
    final class Watch: CallCancellation, @unchecked Sendable {
        let deadline: ContinuousClock.Instant
        init(deadline: ContinuousClock.Instant) {
            self.deadline = deadline
            super.init()
        }
    }

    /// Watches in start order, for one cap.
    private struct Queue {
        let limit: Duration
        var watches: [Watch] = []
        /// Queue length at which finished watches stuck behind a long call are dropped: twice
        /// what the last pruning left (at least 1,024), so live calls are not rescanned per sweep.
        var pruneAt = 1024
    }
    private final class Shard: Sendable {
        let queues = Mutex<[Queue]>([])
    }
    private let shards: [ObjectIdentifier: Shard]
    private let fallback = Shard()

    /// - Parameter loops: the loops calls start on, each with queues of its own.
    init(loops: [any EventLoop] = []) {
        var shards: [ObjectIdentifier: Shard] = [:]
        for loop in loops { shards[ObjectIdentifier(loop)] = Shard() }
        self.shards = shards
    }

    private var allShards: [Shard] { [fallback] + shards.values }

    /// Watches a call about to start; register the call with the watch once it exists.
    func watch(for limit: Duration) -> Watch {
        let shard = MultiThreadedEventLoopGroup.currentEventLoop.flatMap { shards[ObjectIdentifier($0)] } ?? fallback
        return shard.queues.withLock { qs in
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
        w.onCancel(cancelling: call)
        return w
    }

    /// Cancels every call past its deadline; returns how many.
    @discardableResult
    func sweep(now: ContinuousClock.Instant = .now) -> Int {
        let due: [Watch] = allShards.flatMap { shard in sweep(shard, now: now) }
        for w in due { w.cancel() }
        return due.count
    }

    /// One shard's pass: drops finished watches, returns those past their deadline.
    private func sweep(_ shard: Shard, now: ContinuousClock.Instant) -> [Watch] {
        shard.queues.withLock { qs in
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
                if q.watches.count > q.pruneAt {
                    q.watches.removeAll { $0.isDone }
                    q.pruneAt = max(1024, 2 * q.watches.count)
                }
                qs[i] = q
            }
            return due
        }
    }

    /// Calls being watched (finished ones no longer count, whether or not swept away yet).
    var count: Int {
        allShards.reduce(0) { n, shard in n + shard.queues.withLock { qs in qs.reduce(0) { n, q in n + q.watches.count { !$0.isDone } } } }
    }

    /// Watches still queued, finished or not (what the sweeper holds in memory).
    var queued: Int { allShards.reduce(0) { n, shard in n + shard.queues.withLock { $0.reduce(0) { $0 + $1.watches.count } } } }

    /// Sweeps every `interval` until cancelled.
    func run(interval: Duration) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            sweep()
        }
    }
}
