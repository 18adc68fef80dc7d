import NIOCore

/// Runs Swift tasks on a NIO event loop. Handlers started with this executor preference run on
/// their connection's loop, so a unary call never hops threads: the request is read, the handler
/// runs and the response is written by one thread. Blocking work (SQLite, scrypt) must be moved
/// off the loop by the code that does it (`Storage` does).
final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    let loop: any EventLoop
    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}

extension EventLoop {
    /// Runs `body` now if on this loop, else schedules it there.
    @inline(__always)
    func runOnLoop(_ body: @escaping @Sendable () -> Void) {
        if inEventLoop { body() } else { execute(body) }
    }
}
