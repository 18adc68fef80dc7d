import Dispatch
import Logging
#if canImport(Glibc)
import Glibc
#endif

extension RPCServer {
    /// Runs until SIGTERM or SIGINT, then shuts down gracefully (GOAWAY, in-flight calls finish
    /// within the grace period) and returns, so the process can exit 0.
    public func runUntilSignalled(logger: Logger = Logger(label: "rpc.server"), onShutdown: @escaping @Sendable () async -> Void = {}) async {
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        signal(SIGPIPE, SIG_IGN)
        let queue = DispatchQueue(label: "rpc.signals")
        let (received, continuation) = AsyncStream<Int32>.makeStream()
        let sources = [SIGTERM, SIGINT].map { sig in
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            return source
        }
        for await sig in received {
            logger.info("received signal \(sig == SIGTERM ? "SIGTERM" : "SIGINT"): shutting down gracefully")
            break
        }
        for source in sources { source.cancel() }
        await onShutdown()
        await shutdownGracefully()
        logger.info("stopped")
    }
}
