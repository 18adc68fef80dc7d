import Logging
import NIOCore
import NIOPosix
import RPCCore
import RPCTLS
import Synchronization

/// State every connection of one server shares (read-only after start, except the registry).
final class ServerShared: Sendable {
    let configuration: ServerConfiguration
    let router: Router
    let logger: Logger
    let registry = ConnectionRegistry()
    let connections = ConnectionCounter()
    /// Each event loop's own scratch (`LoopScratch`), fixed at start: a connection finds its
    /// loop's once.
    let loopScratch: [ObjectIdentifier: LoopScratch]

    init(configuration: ServerConfiguration, router: Router, logger: Logger, loops: [any EventLoop] = []) {
        self.configuration = configuration
        self.router = router
        self.logger = logger
        var scratch: [ObjectIdentifier: LoopScratch] = [:]
        for loop in loops { scratch[ObjectIdentifier(loop)] = LoopScratch() }
        self.loopScratch = scratch
    }

    /// `loop`'s scratch (one of its own for a loop the server was not given).
    func scratch(for loop: any EventLoop) -> LoopScratch { loopScratch[ObjectIdentifier(loop)] ?? LoopScratch() }
}

/// What the connections of one event loop reuse from call to call (touched on that loop only).
/// Kept per loop rather than per connection, so what it holds is bounded by the loops, not by
/// the connections (a client that opens many cannot make each keep some).
final class LoopScratch: @unchecked Sendable {
    /// Storage of relayed calls' metadata, emptied for the next ones (at most `maxSpareMetadata`
    /// buffers of at most `maxSpareMetadataBytes` each).
    var spareMetadata: [MetadataBytes] = []
    static let maxSpareMetadata = 64
    static let maxSpareMetadataBytes = 4096
}

/// A connection a graceful shutdown drains: HTTP/2 (GOAWAY, in-flight streams finish) or
/// HTTP/1.1 (the request in progress is answered, then the connection closes).
protocol DrainableConnection: AnyObject {
    /// Stop taking new requests; close once the ones in progress are answered.
    func beginGracefulShutdown()
    /// The grace period is over: close now.
    func forceClose()
}

/// Live connections, so a graceful shutdown can reach each one on its own loop.
final class ConnectionRegistry: Sendable {
    private let entries = Mutex<[ObjectIdentifier: (any EventLoop, NIOLoopBound<any DrainableConnection>)]>([:])
    /// Who waits for the registry to empty, by waiter id (a cancelled wait leaves early).
    private let emptied = Mutex<[Int: CheckedContinuation<Void, Never>]>([:])
    private let nextWaiter = Atomic<Int>(0)
    /// Set when draining starts, before the registry is read: connections registered later are
    /// asked to drain as they arrive (one registered meanwhile may be asked twice: harmless).
    private let drainRequested = Atomic<Bool>(false)

    func add(_ connection: any DrainableConnection, loop: any EventLoop) {
        let bound = NIOLoopBound(connection, eventLoop: loop)
        entries.withLock { $0[ObjectIdentifier(connection)] = (loop, bound) }
        // Registered after the drain was asked for (a sniffer handing over to the handler of
        // its protocol): this one is asked too, once it is in place.
        if drainRequested.load(ordering: .sequentiallyConsistent) { loop.execute { bound.value.beginGracefulShutdown() } }
    }
    func remove(_ connection: any DrainableConnection) {
        let waiters: [CheckedContinuation<Void, Never>] = entries.withLock { e in
            guard e.removeValue(forKey: ObjectIdentifier(connection)) != nil else { return [] }
            return e.isEmpty
                ? emptied.withLock { w in
                    defer { w = [:] }; return Array(w.values)
                } : []
        }
        for w in waiters { w.resume() }
    }
    var count: Int { entries.withLock { $0.count } }

    /// Set once every connection has been asked to drain (tests watch it).
    let draining = Atomic<Bool>(false)

    /// Asks every connection to drain, each on its own loop (all at once); returns once all were
    /// asked.
    func beginDraining() async {
        drainRequested.store(true, ordering: .sequentiallyConsistent)
        let asked = entries.withLock { $0 }.values.map { loop, bound in loop.submit { bound.value.beginGracefulShutdown() } }
        for f in asked { try? await f.get() }
        draining.store(true, ordering: .releasing)
    }

    func forEach(_ body: @escaping @Sendable (any DrainableConnection) -> Void) {
        for (_, (loop, bound)) in entries.withLock({ $0 }) {
            loop.execute { body(bound.value) }
        }
    }
    /// Returns once no connection is left, or when the waiting task is cancelled (the grace
    /// period ran out).
    func waitUntilEmpty() async {
        let id = nextWaiter.wrappingAdd(1, ordering: .relaxed).oldValue
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let done = entries.withLock { e in
                    if e.isEmpty { return true }
                    // Checked under the waiters' lock, which the cancellation handler takes too:
                    // a cancellation either finds this waiter or is seen here.
                    return emptied.withLock { w in
                        if Task.isCancelled { return true }
                        w[id] = c
                        return false
                    }
                }
                if done { c.resume() }
            }
        } onCancel: {
            emptied.withLock { $0.removeValue(forKey: id) }?.resume()
        }
    }
}

/// A gRPC server: h2c (or TLS with ALPN h2) on one port, routing to registered services.
public final class RPCServer: Sendable {
    public let configuration: ServerConfiguration
    let shared: ServerShared
    let group: MultiThreadedEventLoopGroup
    private let listener = Mutex<(any Channel)?>(nil)

    /// - Parameter group: the event loops to serve on, made by the caller when it must know
    ///   them beforehand (the gateway keeps per-loop state); the server shuts it down when it
    ///   stops. By default `configuration.threads` loops of the server's own.
    public init(
        configuration: ServerConfiguration, services: [any RPCService], logger: Logger = Logger(label: "rpc.server"),
        group: MultiThreadedEventLoopGroup? = nil
    ) {
        self.configuration = configuration
        let group = group ?? MultiThreadedEventLoopGroup(numberOfThreads: max(1, configuration.threads))
        self.shared = ServerShared(
            configuration: configuration, router: Router(services: services, interceptors: ServerInterceptors(configuration.interceptors)),
            logger: logger, loops: Array(group.makeIterator()))
        self.group = group
    }

    /// Binds and starts accepting; returns the bound port (useful with port 0).
    @discardableResult
    public func start() async throws -> Int {
        let shared = self.shared
        configuration.observer?.prepare(shared.router.methods.values.map(\.descriptor).sorted { $0.path < $1.path })
        let tls = configuration.tls
        var bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 4)
            .childChannelOption(.writeBufferWaterMark, value: .init(low: 64 * 1024, high: 256 * 1024))
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ConnectionGuard(shared: shared))
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(OpenSSLHandler(configuration: tls))
                    }
                    if shared.configuration.acceptHTTP1 {
                        try channel.pipeline.syncOperations.addHandler(ProtocolSniffer(shared: shared))
                    } else {
                        try channel.pipeline.syncOperations.addHandler(ServerConnectionHandler(shared: shared))
                    }
                }
            }
        if let idle = configuration.tcpKeepaliveIdle {
            func tcp(_ name: Int32) -> ChannelOptions.Types.SocketOption {
                ChannelOptions.Types.SocketOption(
                    level: NIOBSDSocket.OptionLevel(rawValue: Int32(IPPROTO_TCP)), name: NIOBSDSocket.Option(rawValue: name))
            }
            bootstrap =
                bootstrap
                .childChannelOption(.socketOption(.so_keepalive), value: 1)
                .childChannelOption(tcp(TCP_KEEPIDLE), value: SocketOptionValue(max(1, idle.components.seconds)))
                .childChannelOption(tcp(TCP_KEEPINTVL), value: 10)
                .childChannelOption(tcp(TCP_KEEPCNT), value: 3)
        }
        let channel: any Channel
        do {
            channel = try await bootstrap.bind(host: configuration.host, port: configuration.port).get()
        } catch {
            // A port in use (or a host that is not this machine's) names the listener that failed.
            throw ListenError(host: configuration.host, port: configuration.port, underlying: error)
        }
        listener.withLock { $0 = channel }
        return channel.localAddress?.port ?? configuration.port
    }

    /// Stops accepting, sends GOAWAY on every connection, lets in-flight calls finish within the
    /// grace period, then closes what is left and stops the event loops.
    public func shutdownGracefully() async {
        let channel = listener.withLock { c in
            defer { c = nil }; return c
        }
        try? await channel?.close().get()
        let registry = shared.registry
        await registry.beginDraining()
        let grace = configuration.shutdownGracePeriod
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await registry.waitUntilEmpty() }
            group.addTask { try? await Task.sleep(for: grace) }
            await group.next()
            group.cancelAll()
        }
        shared.registry.forEach { $0.forceClose() }
        try? await Task.sleep(for: .milliseconds(50))
        try? await group.shutdownGracefully()
    }

    /// Number of open connections (for tests and metrics).
    public var connectionCount: Int { shared.registry.count }
    /// Open sockets, counted from accept (before TLS and protocol sniffing): what
    /// `maxConnections` caps.
    public var openSocketCount: Int { shared.connections.count }
    /// Bytes of large requests the process holds now (`maxBufferedRequestBytesPerProcess`).
    public var bufferedRequestBytes: Int { configuration.requestBudget.inUse }
}

/// A server could not listen: on which address, and why (the bind error alone names neither).
public struct ListenError: Error, CustomStringConvertible {
    public let host: String
    public let port: Int
    public let underlying: any Error
    public var description: String { "cannot listen on \(host):\(port): \(underlying)" }
}
