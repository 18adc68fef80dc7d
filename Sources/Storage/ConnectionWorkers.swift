import Foundation
import Synchronization

/// Moves a value to another thread when the code guarantees a single owner at a time.
struct UncheckedTransfer<Value>: @unchecked Sendable {
    var value: Value
}

/// A few dedicated threads, each owning one connection, fed from one FIFO of jobs.
///
/// Why threads of our own rather than the cooperative pool or a concurrent `DispatchQueue`: SQLite
/// calls block (disk I/O, fsync, busy waits), and blocking the Swift concurrency pool or a NIO
/// event loop stalls unrelated requests; Dispatch would grow threads without bound under load. A
/// fixed set of threads bounds both the connections and the parallelism, and each connection is
/// only ever touched by its own thread.
final class ConnectionWorkers: @unchecked Sendable {
    /// Resumes a caller; receives the error of the batch's WAL sync, if any.
    typealias Finish = @Sendable (StorageError?) -> Void
    /// What a job leaves behind: whether it committed (needs the batch sync) and how to finish it.
    struct Outcome {
        var committed: Bool
        var finish: Finish
    }
    typealias Job = @Sendable (Connection) -> Outcome

    private struct Queued {
        var job: Job
        /// Run only after every earlier commit is durable (the outbox reads events this way).
        var durableBarrier: Bool
    }

    /// Group commit: at most this many commits share one WAL fsync, bounding a caller's wait.
    static let maximumBatch = 64

    private let condition = NSCondition()
    private let groupCommit: Bool
    /// The writer's metrics (queue depth, WAL size); nil for the readers.
    private let metrics: StorageMetrics?
    /// Jobs that may wait at once; past it `submit` sheds load (`overloaded`) instead of letting
    /// every caller wait longer.
    let maxQueued: Int
    // Guarded by `condition`.
    private var jobs: [Queued?] = []
    private var head = 0
    private var shuttingDown = false
    private var running = 0
    private var threads: [pthread_t] = []

    /// - Parameter groupCommit: finish jobs only after an fsync of the WAL that covers their
    ///   commits, one fsync per batch of queued jobs (the writer in `.full` mode).
    /// - Parameter metrics: the queue depth is kept in `writeQueueDepth`, and the WAL's size is
    ///   read after a commit at most once per `StorageMetrics.walSampleInterval`.
    init(name: String, connections: [Connection], groupCommit: Bool = false, maxQueued: Int = 2048, metrics: StorageMetrics? = nil) {
        self.groupCommit = groupCommit
        self.metrics = metrics
        self.maxQueued = max(1, maxQueued)
        running = connections.count
        for (i, connection) in connections.enumerated() {
            let owned = UncheckedTransfer(value: connection)
            let thread = Thread { [self] in
                self.loop(owned)
            }
            thread.name = "\(name)-\(i)"
            thread.start()
        }
    }

    private func loop(_ owned: UncheckedTransfer<Connection>) {
        condition.lock()
        threads.append(pthread_self())
        condition.unlock()
        let connection = owned.value
        var unsynced: [Finish] = []
        var dirty = false
        // When the WAL's size is read next (after a commit): the first commit reads it.
        var nextWALSample = ContinuousClock.now
        func flush() {
            let error = dirty ? connection.syncWAL() : nil
            for finish in unsynced { finish(error) }
            unsynced.removeAll(keepingCapacity: true)
            dirty = false
        }
        while true {
            condition.lock()
            if head == jobs.count && !unsynced.isEmpty {
                // The queue drained: make the batch durable, then acknowledge it.
                condition.unlock()
                flush()
                continue
            }
            while head == jobs.count && !shuttingDown { condition.wait() }
            if head == jobs.count {
                // Shutting down and drained: close the connection on its own thread.
                connection.close()
                running -= 1
                condition.broadcast()
                condition.unlock()
                return
            }
            let queued = jobs[head]!
            jobs[head] = nil  // the job (and what it captures) is released as soon as it ran
            head += 1
            if head == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                head = 0
            }
            metrics?.writeQueueDepth.set(to: Double(jobs.count - head))
            condition.unlock()
            if queued.durableBarrier && !unsynced.isEmpty { flush() }
            let outcome = queued.job(connection)
            if let metrics, outcome.committed {
                let now = ContinuousClock.now
                if now >= nextWALSample {
                    nextWALSample = now + StorageMetrics.walSampleInterval
                    metrics.sampleWAL()
                }
            }
            if groupCommit {
                dirty = dirty || outcome.committed
                unsynced.append(outcome.finish)
                if unsynced.count >= Self.maximumBatch { flush() }
            } else {
                outcome.finish(nil)
            }
        }
    }

    /// Queues a job; throws `closed` once shutdown began, `overloaded` when `maxQueued` jobs wait
    /// already (unless `bypassLimit`: the outbox's own reads, which must not starve).
    func submit(durableBarrier: Bool = false, bypassLimit: Bool = false, _ job: @escaping Job) throws {
        condition.lock()
        defer { condition.unlock() }
        guard !shuttingDown else { throw StorageError.closed }
        if !bypassLimit && jobs.count - head >= maxQueued { throw StorageError.overloaded(queued: jobs.count - head) }
        jobs.append(Queued(job: job, durableBarrier: durableBarrier))
        metrics?.writeQueueDepth.set(to: Double(jobs.count - head))
        condition.signal()
    }

    /// True on one of this pool's threads, where waiting for the pool would deadlock.
    var isCurrentThreadAWorker: Bool {
        let me = pthread_self()
        condition.lock()
        defer { condition.unlock() }
        return threads.contains { pthread_equal($0, me) != 0 }
    }

    /// Runs `body` on a worker and resumes the caller with its result (after the batch's WAL sync
    /// in group-commit mode). `afterSync` runs on success once the result is durable.
    ///
    /// A job whose caller was cancelled before it started (the client went away, its deadline
    /// passed) is skipped: the body never runs and the caller gets `CancellationError`. A job
    /// that started runs to its end (a write commits or rolls back as a whole).
    func run<T: Sendable>(
        durableBarrier: Bool = false,
        commits: Bool = true,
        bypassLimit: Bool = false,
        afterSync: (@Sendable (T) -> Void)? = nil,
        _ body: @escaping @Sendable (Connection) throws -> T
    ) async throws -> T {
        if Task.isCancelled { throw CancellationError() }
        let ticket = JobTicket()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
                do {
                    try submit(durableBarrier: durableBarrier, bypassLimit: bypassLimit) { connection in
                        guard !ticket.isCancelled else {
                            return Outcome(committed: false) { _ in continuation.resume(throwing: CancellationError()) }
                        }
                        let result = Result { try body(connection) }
                        let committed = commits && result.isSuccess
                        return Outcome(committed: committed) { syncError in
                            if let syncError, committed {
                                continuation.resume(throwing: syncError)
                                return
                            }
                            if case .success(let value) = result { afterSync?(value) }
                            continuation.resume(with: result)
                        }
                    }
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            ticket.cancel()
        }
    }

    /// Runs `body` on a worker, blocking the calling thread until it is done (and durable).
    func runSync<T>(_ body: (Connection) throws -> T) throws -> T {
        if isCurrentThreadAWorker {
            throw StorageError.misuse("readSync/writeSync called from inside a read or write body (it would deadlock)")
        }
        return try withoutActuallyEscaping(body) { escapable in
            let done = DispatchSemaphore(value: 0)
            let state = UncheckedTransfer(value: SyncState<T>(body: escapable))
            try submit { connection in
                state.value.result = Result { try state.value.body!(connection) }
                // Drop the non-escaping body before the caller can return: it must not outlive the call.
                state.value.body = nil
                let committed = state.value.result!.isSuccess
                return Outcome(committed: committed) { syncError in
                    if let syncError, committed { state.value.result = .failure(syncError) }
                    done.signal()
                }
            }
            done.wait()
            return try state.value.result!.get()
        }
    }

    /// Stops accepting jobs, lets queued ones finish, closes the connections and waits for the
    /// threads to exit (unless called from one of them).
    func shutdown() {
        let onWorker = isCurrentThreadAWorker
        condition.lock()
        shuttingDown = true
        condition.broadcast()
        if !onWorker {
            while running > 0 { condition.wait() }
        }
        condition.unlock()
    }
}

/// Set when a queued job's caller is cancelled: the worker skips the job.
final class JobTicket: Sendable {
    private let cancelled = Atomic<Bool>(false)
    var isCancelled: Bool { cancelled.load(ordering: .acquiring) }
    func cancel() { cancelled.store(true, ordering: .releasing) }
}

private final class SyncState<T> {
    var body: ((Connection) throws -> T)?
    var result: Result<T, Error>?
    init(body: @escaping (Connection) throws -> T) { self.body = body }
}

extension Result {
    var isSuccess: Bool {
        if case .success = self { return true }
        return false
    }
}
