import NIOPosix

/// Output a connection's read produced on other connections, written as soon as that read is done
/// instead of in a task of its own (`EventLoop.execute`: a closure, the task queue's lock and
/// copies, ≈ 1,000–2,400 instructions a connection and a wakeup, on a lone relayed call's path).
///
/// - **A client connection's read** (an upstream's answers) completes calls of server
///   connections: those are flushed when the read is done. Nothing coalesces less: a task would
///   have run after this tick's reads, and every answer an upstream read carries is in that read.
/// - **A server connection's read** (a client's requests) starts calls on client connections (a
///   relay's upstreams). A client connection whose only call that read started is flushed when
///   the read is done: a lone call leaves at once. One to which the read started more calls, or
///   that had calls open already, keeps its task, whose one write carries the calls every server
///   connection read in the tick starts (a relay under load: one write upstream for many
///   clients' requests).
///
/// One per event-loop thread (the client and server connections of a loop share it), used only
/// on that thread: a connection finds it once, on its loop (`forThisThread`).
///
/// The two directions are written out rather than one generic helper object per direction: that
/// was tried, and its retains and protocol calls cost a lone relayed call ≈ 300 instructions
/// (0.5%) more (`scripts/per-call instructions`, three runs each).
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

    /// Server connections' reads in progress on this thread (counted likewise).
    private var readingRequests = 0
    private var pendingUpstreams: [ClientConnectionHandler] = []
    private var spareUpstreams: [ClientConnectionHandler] = []

    /// Whether a server connection's flush can wait for the end of the read in progress.
    var isReading: Bool { reading > 0 }

    /// Whether a client connection's flush can wait for the end of the server connection's read
    /// in progress.
    var isReadingRequests: Bool { readingRequests > 0 }

    func flushAfterRead(_ connection: ServerConnectionHandler) { pending.append(connection) }

    func flushAfterRequestsRead(_ connection: ClientConnectionHandler) { pendingUpstreams.append(connection) }

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

    /// Runs `body` (a server connection's read), then writes the client connections it started
    /// a lone call on (`ClientConnectionHandler.requestsRead`).
    @inline(__always)
    func duringRequestsRead<R>(_ body: () -> R) -> R {
        readingRequests += 1
        let result = body()
        readingRequests -= 1
        if readingRequests == 0 && !pendingUpstreams.isEmpty { drainUpstreams() }
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

    private func drainUpstreams() {
        // As `drain`: nothing joins the list while it is walked.
        swap(&pendingUpstreams, &spareUpstreams)
        for connection in spareUpstreams { connection.requestsRead() }
        spareUpstreams.removeAll(keepingCapacity: true)
    }
}
