import Logging
import NIOCore
import NIOPosix
import RPCCore
import RPCTLS
import Synchronization

/// Where and how a channel connects.
public struct ChannelConfiguration: Sendable {
    public var host: String
    public var port: Int
    /// When set, the channel speaks TLS (ALPN `h2`), verifying the server as the configuration says
    /// (and presenting its client certificate, if it has one).
    public var tls: TLSConfiguration?
    /// The name the server's certificate must be valid for (and the SNI), when it is not
    /// `tls.serverName` or, failing that, `host`: one shared TLS configuration serves many
    /// channels, each naming its own server.
    public var tlsServerName: String?
    /// `:authority` sent with every call (defaults to host:port).
    public var authority: String
    public var connectTimeout: Duration = .seconds(2)
    /// Reconnect backoff after a failed connection: grows by `backoffMultiplier` up to the maximum.
    public var initialBackoff: Duration = .milliseconds(100)
    public var maxBackoff: Duration = .seconds(5)
    public var backoffMultiplier: Double = 1.6
    public var initialWindowSize: Int = 1024 * 1024
    public var maxHeaderListSize: Int = 16 * 1024
    public var maxReceiveMessageSize: Int = 4 * 1024 * 1024
    /// Bytes a sender may queue per stream before `send` waits for the server to read.
    public var maxBufferedRequestBytes: Int = 256 * 1024
    /// Keepalive: after this long without reading anything, send a PING; when nothing at all
    /// comes back within `keepaliveTimeout`, the peer is taken for dead: the connection closes
    /// and its calls fail with UNAVAILABLE (the next call reconnects). Keeps a quiet long-lived
    /// call (a relayed notification stream) alive through NATs and proxies and notices a peer
    /// that vanished without a FIN. nil (default): no PINGs. Servers may limit how often they
    /// accept PINGs (grpc-go: every 5 min without calls): keep it well above a minute against
    /// servers we do not run.
    public var keepaliveTime: Duration?
    public var keepaliveTimeout: Duration = .seconds(20)
    /// Also PING while no call is open (gRPC's `permit_without_calls`); otherwise only while
    /// calls are in flight.
    public var keepaliveWithoutCalls = false

    /// Metadata every call on the channel carries, after the call's own (a relay's credential:
    /// the gateway's `x-gateway-token`). Encoded once per connection, with the fixed request
    /// headers, rather than added to each call's metadata.
    public var metadata = Metadata()

    public init(host: String, port: Int, authority: String? = nil, tls: TLSConfiguration? = nil) {
        self.host = host
        self.port = port
        self.tls = tls
        self.authority = authority ?? "\(host):\(port)"
    }
    /// `host:port`, as the transport's own messages name the server.
    public var target: String { "\(host):\(port)" }

    /// `host:port` or `[v6]:port` as a host (brackets removed) and a port; nil when it is neither.
    public static func address(_ addr: String) -> (host: String, port: Int)? {
        guard let colon = addr.lastIndex(of: ":"), let port = Int(addr[addr.index(after: colon)...]), (1...65535).contains(port) else {
            return nil
        }
        var host = String(addr[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
        } else if host.contains(":") {
            return nil  // a bare IPv6 address ("fe80::1" is not host "fe80:", port 1): brackets needed
        }
        return host.isEmpty ? nil : (host, port)
    }
}

/// A client channel: one HTTP/2 connection to a server, shared by every concurrent call
/// (multiplexed as streams), opened lazily and reopened when the peer restarts or sends GOAWAY.
/// While the peer is unreachable calls fail fast with UNAVAILABLE, and reconnection attempts are
/// spaced by an exponential backoff.
public final class RPCChannel: ClientTransport, Sendable {
    public let configuration: ChannelConfiguration
    private let group: any EventLoopGroup
    private let ownsGroup: Bool

    private struct Connection: @unchecked Sendable {
        let channel: any Channel
        let handler: NIOLoopBound<ClientConnectionHandler>
        let generation: Int
    }
    private struct State {
        var connection: Connection?
        var connecting: [CheckedContinuation<Connection, any Error>]? = nil
        var generation = 0
        var nextAttempt: ContinuousClock.Instant?
        var backoff: Duration
        var lastError = ""
        var closed = false
        /// The newest connection generation that has closed: one that closed while it was being
        /// set up (a server that hangs up at once) must not be kept as the channel's connection.
        var closedGeneration = 0
    }
    /// The state, in an object of its own: a closing connection reports to it through a weak
    /// reference (`connect`), and a weak reference to the channel itself would give the channel
    /// a side table, which sends every retain and release of it (one each per relayed call in
    /// the gateway) down the runtime's slow path: ≈ 1% of the gateway's CPU per call, measured.
    private final class Shared: Sendable {
        let state: Mutex<State>
        init(_ state: State) { self.state = Mutex(state) }

        func connectionClosed(generation: Int) {
            state.withLock { s in
                if s.connection?.generation == generation { s.connection = nil }
                s.closedGeneration = max(s.closedGeneration, generation)
            }
        }
    }
    private let shared: Shared

    public init(configuration: ChannelConfiguration, group: (any EventLoopGroup)? = nil) {
        self.configuration = configuration
        self.group = group ?? MultiThreadedEventLoopGroup(numberOfThreads: 1)
        self.ownsGroup = group == nil
        self.shared = Shared(State(backoff: configuration.initialBackoff))
    }

    public convenience init(host: String, port: Int) {
        self.init(configuration: ChannelConfiguration(host: host, port: port))
    }

    /// A typed client over this channel.
    public var client: RPCClient { RPCClient(transport: self) }

    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        let connection = try await connection()
        let call = ClientCall()
        let handler = connection.handler
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            connection.channel.eventLoop.execute {
                handler.value.start(ObservedStream(call), method: method, options: options)
                c.resume()
            }
        }
        return call
    }

    /// Starts a call without a task (a `TasklessCall` subclass: `PendingUnaryCall`, the gateway's
    /// relayed calls): when the connection is up and lives on the calling thread's event loop,
    /// the stream is opened right here; otherwise on the connection's loop once it is up.
    public func start(_ call: TasklessCall, _ method: MethodDescriptor, options: CallOptions = .defaults) {
        if let connection = shared.state.withLock({ $0.connection }) {
            Self.start(call, method, options, on: connection)
        } else {
            Task {
                do {
                    Self.start(call, method, options, on: try await connection())
                } catch let error as RPCError {
                    call.fail(RPCStatus(error.code, error.message))
                } catch {
                    call.fail(RPCStatus(.unavailable, "\(error)"))
                }
            }
        }
    }

    private static func start(_ call: TasklessCall, _ method: MethodDescriptor, _ options: CallOptions, on connection: Connection) {
        let handler = connection.handler
        let loop = connection.channel.eventLoop
        // Not `runOnLoop`: its escaping closure would be allocated on the usual, same-loop path.
        if loop.inEventLoop {
            handler.value.start(call, method: method, options: options, request: call.request)
        } else {
            loop.execute { handler.value.start(call, method: method, options: options, request: call.request) }
        }
    }

    private func connection() async throws -> Connection {
        enum Step { case ready(Connection), wait, connect(Int), fail(String) }
        let step: Step = shared.state.withLock { s in
            if s.closed { return .fail("channel to \(configuration.target) is closed") }
            if let c = s.connection { return .ready(c) }
            if s.connecting != nil { return .wait }
            if let next = s.nextAttempt, ContinuousClock.now < next {
                return .fail("\(configuration.target) is unavailable (\(s.lastError)); next attempt in \(next - .now)")
            }
            s.connecting = []
            s.generation += 1
            return .connect(s.generation)
        }
        switch step {
        case .ready(let c): return c
        case .fail(let m): throw RPCError(.unavailable, m)
        case .wait:
            return try await withCheckedThrowingContinuation { c in
                let ready: Result<Connection, any Error>? = shared.state.withLock { s in
                    if let conn = s.connection { return .success(conn) }
                    if s.connecting == nil { return .failure(RPCError(.unavailable, "\(configuration.target) is unavailable (\(s.lastError))")) }
                    s.connecting!.append(c)
                    return nil
                }
                if let ready { c.resume(with: ready) }
            }
        case .connect(let generation):
            do {
                let conn = try await connect(generation: generation)
                let waiters = try shared.state.withLock { s in
                    if s.closedGeneration >= generation {
                        let hint = configuration.tls == nil ? " (a port that requires TLS closes cleartext h2c connections)" : ""
                        throw ConnectFailure(description: "connection to \(configuration.target) closed as soon as it opened\(hint)")
                    }
                    s.connection = conn
                    s.backoff = configuration.initialBackoff
                    s.nextAttempt = nil
                    defer { s.connecting = nil }
                    return s.connecting ?? []
                }
                for w in waiters { w.resume(returning: conn) }
                return conn
            } catch {
                let message = "cannot connect to \(configuration.target): \(error)"
                let waiters = shared.state.withLock { s in
                    s.lastError = "\(error)"
                    s.nextAttempt = .now + s.backoff
                    s.backoff = min(s.backoff * configuration.backoffMultiplier, configuration.maxBackoff)
                    defer { s.connecting = nil }
                    return s.connecting ?? []
                }
                for w in waiters { w.resume(throwing: RPCError(.unavailable, message)) }
                throw RPCError(.unavailable, message)
            }
        }
    }

    private func connect(generation: Int) async throws -> Connection {
        let config = configuration
        let onClose: @Sendable () -> Void = { [weak shared] in shared?.connectionClosed(generation: generation) }
        let readyBox = ReadySlot()
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(TimeAmount(config.connectTimeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls = config.tls {
                        let name = config.tlsServerName ?? tls.serverName ?? config.host
                        try channel.pipeline.syncOperations.addHandler(OpenSSLHandler(configuration: tls, serverName: name))
                    }
                    let ready = channel.eventLoop.makePromise(of: Void.self)
                    let handler = ClientConnectionHandler(configuration: config, ready: ready, onClose: onClose)
                    readyBox.slot.withLock { $0 = (ready.futureResult, NIOLoopBound(handler, eventLoop: channel.eventLoop)) }
                    try channel.pipeline.syncOperations.addHandler(handler)
                }
            }
        let channel = try await bootstrap.connect(host: config.host, port: config.port).get()
        guard let (ready, handler) = readyBox.slot.withLock({ $0 }) else {
            throw ConnectFailure(description: "connection to \(config.target) was not set up")
        }
        // TLS: calls may only start once the handshake succeeded and the server spoke (see
        // `ClientConnectionHandler.ready`); its failure is the error.
        do {
            try await ready.get()
        } catch let e as RPCError {
            throw ConnectFailure(description: e.message)
        }
        // A server that hung up at once (a TLS port refusing cleartext): its reason, not a
        // connection that is already gone.
        try await channel.eventLoop.submit {
            if let reason = handler.value.closedReason { throw ConnectFailure(description: reason.message) }
        }.get()
        return Connection(channel: channel, handler: handler, generation: generation)
    }

    final class ReadySlot: Sendable {
        let slot = Mutex<(EventLoopFuture<Void>, NIOLoopBound<ClientConnectionHandler>)?>(nil)
    }
    struct ConnectFailure: Error, CustomStringConvertible { let description: String }

    /// Asks the open connection, if any, to prove the peer is still there: a PING now, and the
    /// connection ends (its calls fail with UNAVAILABLE, the next call reconnects) when nothing
    /// comes back within `timeout`. For a caller that has a sign the peer vanished without
    /// closing (a link cut, packets dropped: no FIN, no RST), such as a health check that timed
    /// out, so that the calls waiting on a dead connection fail now rather than at their
    /// deadlines or at the next keepalive. Costs one PING round trip on a healthy connection.
    public func checkLiveness(timeout: Duration) {
        guard let connection = shared.state.withLock({ $0.connection }) else { return }
        let handler = connection.handler
        connection.channel.eventLoop.execute { handler.value.checkLiveness(timeout: timeout) }
    }

    /// Closes the connection (in-flight calls fail with UNAVAILABLE) and the channel's own threads.
    public func close() async {
        let conn = shared.state.withLock { s in
            s.closed = true
            defer { s.connection = nil }
            return s.connection
        }
        try? await conn?.channel.close().get()
        if ownsGroup { try? await group.shutdownGracefully() }
    }
}
