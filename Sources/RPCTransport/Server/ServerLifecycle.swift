import Dispatch
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// SIGTERM and SIGINT, watched from the first use on. Processes call `install()` before they
/// report that they listen: a signal that arrives between that report and
/// `runUntilSignalled` is then kept, not fatal (the default action would kill the process with
/// status 15 instead of a graceful exit 0).
public final class ShutdownSignals: @unchecked Sendable {
    public static let shared = ShutdownSignals()

    private let received: AsyncStream<Int32>
    private let sources: [any DispatchSourceSignal]

    private init() {
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        signal(SIGPIPE, SIG_IGN)
        let (received, continuation) = AsyncStream<Int32>.makeStream()
        let queue = DispatchQueue(label: "rpc.signals")
        self.received = received
        self.sources = [SIGTERM, SIGINT].map { sig in
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            return source
        }
    }

    /// Starts watching (idempotent).
    public static func install() { _ = shared }

    /// The next signal (one already received counts).
    public func next() async -> Int32? {
        var it = received.makeAsyncIterator()
        return await it.next()
    }
}

extension RPCServer {
    /// Runs until SIGTERM or SIGINT, then shuts down gracefully (GOAWAY, in-flight calls finish
    /// within the grace period) and returns, so the process can exit 0.
    public func runUntilSignalled(logger: Logger = Logger(label: "rpc.server"), onShutdown: @escaping @Sendable () async -> Void = {}) async {
        let sig = await ShutdownSignals.shared.next()
        logger.info("received signal \(sig == SIGINT ? "SIGINT" : "SIGTERM"): shutting down gracefully")
        await onShutdown()
        await shutdownGracefully()
        logger.info("stopped")
    }
}
