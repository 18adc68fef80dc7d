import NIOPosix
import RPCCore
import Synchronization

/// Threads for blocking work (password hashing, file I/O), bounded twice: a fixed number of
/// threads (NIOThreadPool) and a bounded number of jobs waiting for them.
///
/// Why: a handler runs on its connection's event loop, so blocking there stalls every call of
/// that loop; an unbounded queue turns a burst (a flood of sign-ups, each ~50 ms of scrypt) into
/// minutes of waiting for everyone behind it. Here a job past the bound is refused at once
/// (`UNAVAILABLE` with a retry hint, the caller's cue to back off), and a job whose caller has
/// gone (cancelled; a call past its deadline is cancelled by the transport) is skipped when its
/// turn comes (NIOThreadPool's cancellation), so the threads only do work someone still waits for.
///
/// NIOThreadPool is the library part; this adds only the admission bound it lacks.
public final class BlockingPool: Sendable {
    public let name: String
    public let threads: Int
    public let maxQueued: Int
    private let pool: NIOThreadPool
    /// Jobs admitted and not finished (running or waiting).
    private let admitted = Atomic<Int>(0)

    public init(name: String, threads: Int, maxQueued: Int) {
        self.name = name
        self.threads = max(1, threads)
        self.maxQueued = max(0, maxQueued)
        pool = NIOThreadPool(numberOfThreads: self.threads)
        pool.start()
    }

    /// Jobs running or waiting now.
    public var load: Int { admitted.load(ordering: .relaxed) }

    /// Runs `body` on a pool thread. Throws UNAVAILABLE at once when `threads + maxQueued` jobs
    /// are admitted already, and `CancellationError` when the caller is cancelled before the job
    /// starts (the job is then never run).
    public func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        let limit = threads + maxQueued
        let before = admitted.wrappingAdd(1, ordering: .acquiringAndReleasing).oldValue
        defer { admitted.wrappingSubtract(1, ordering: .acquiringAndReleasing) }
        if before >= limit { throw Self.overloaded(name) }
        if Task.isCancelled { throw CancellationError() }
        return try await pool.runIfActive(body)
    }

    static func overloaded(_ name: String) -> RPCError {
        RPCError.retryLater("the service is busy (\(name)): retry in a second", after: .seconds(1), code: .unavailable)
    }

    /// Stops the threads after the jobs already queued (process shutdown, tests).
    public func shutdown() async {
        try? await pool.shutdownGracefully()
    }
}
