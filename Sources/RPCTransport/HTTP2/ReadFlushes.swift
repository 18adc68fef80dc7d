import NIOPosix

/// Server connections whose output a client connection's read produced (a relay's answers: the
/// upstream's read completes the clients' calls), flushed as soon as that read is done instead of
/// each in a task of its own (`EventLoop.execute`: a closure, the task queue's lock and copies,
/// ≈ 1,000 instructions a connection and a wakeup, a lone relayed call's whole answer path).
/// Nothing coalesces less: a task would have run after this tick's reads, and every answer an
/// upstream read carries is in that read. Requests going upstream keep their task: one write
/// there carries the calls of every client connection read in the tick.
///
/// One per event-loop thread (the client and server connections of a loop share it), used only
/// on that thread: a connection finds it once, on its loop (`forThisThread`).
final class ReadFlushes: @unchecked Sendable {
    private static let perThread = ThreadSpecificVariable<ReadFlushes>()

    /// This thread's.
    static var forThisThread: ReadFlushes {
        if let f = perThread.currentValue { return f }
        let f = ReadFlushes()
        perThread.currentValue = f
        return f
    }

    /// Client connections' reads in progress on this thread (nested only if a read's handling
    /// were to read another connection: never, but counted rather than assumed).
    private var reading = 0
    private var pending: [ServerConnectionHandler] = []
    private var spare: [ServerConnectionHandler] = []

    /// Whether a server connection's flush can wait for the end of the read in progress.
    var isReading: Bool { reading > 0 }

    func flushAfterRead(_ connection: ServerConnectionHandler) { pending.append(connection) }

    /// Runs `body` (a client connection's read), then flushes the server connections it gave
    /// output to.
    @inline(__always)
    func duringRead<R>(_ body: () -> R) -> R {
        reading += 1
        let result = body()
        reading -= 1
        if reading == 0 && !pending.isEmpty { drain() }
        return result
    }

    private func drain() {
        // No read is in progress now, so a flush asked for while these run (a closed
        // connection's teardown, a writability change) takes a task and never lands in the list
        // being walked; the swap keeps both lists' storage for the next read.
        swap(&pending, &spare)
        for connection in spare { connection.flush() }
        spare.removeAll(keepingCapacity: true)
    }
}
