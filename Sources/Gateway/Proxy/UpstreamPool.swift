import NIOCore
import NIOPosix
import RPCCore
import RPCTransport
import Synchronization

/// One HTTP/2 connection to an upstream and the calls running on it.
final class PooledChannel: Sendable {
    let channel: RPCChannel
    let active = Atomic<Int>(0)
    /// On the pool's own loop (closed by the pool) rather than a server loop (closed with it).
    let ownLoop: Bool
    init(_ channel: RPCChannel, ownLoop: Bool) {
        self.channel = channel
        self.ownLoop = ownLoop
    }
}

/// Connections to one upstream service. Calls started on one of the gateway's event loops use a
/// connection living on that same loop, so proxying a call never hops threads; each loop opens
/// more connections when its streams pass `streamsPerConnection` (the upstream caps concurrent
/// streams per connection, and long-lived streams must not starve new calls). Calls from
/// elsewhere (health polls, key fetches) use connections on the pool's own loop.
public final class UpstreamPool: ClientTransport, Sendable {
    public let name: String
    let configuration: ChannelConfiguration
    let streamsPerConnection: Int
    let maxConnectionsPerLoop: Int
    private let fallbackLoop: any EventLoop
    private let byLoop = Mutex<[ObjectIdentifier: [PooledChannel]]>([:])
    private let closed = Atomic<Bool>(false)

    init(
        name: String, configuration: ChannelConfiguration, fallbackLoop: any EventLoop,
        streamsPerConnection: Int = 90, maxConnectionsPerLoop: Int = 16
    ) {
        self.name = name
        self.configuration = configuration
        self.fallbackLoop = fallbackLoop
        self.streamsPerConnection = max(1, streamsPerConnection)
        self.maxConnectionsPerLoop = max(1, maxConnectionsPerLoop)
    }

    /// A connection for a new call, its active count already raised (lower it with `release`).
    func acquire() -> PooledChannel {
        let loop = MultiThreadedEventLoopGroup.currentEventLoop ?? fallbackLoop
        let key = ObjectIdentifier(loop)
        return byLoop.withLock { map in
            var list = map[key] ?? []
            var best: PooledChannel? = nil
            var bestLoad = Int.max
            for c in list {
                let load = c.active.load(ordering: .relaxed)
                if load < streamsPerConnection { best = c; bestLoad = load; break }
                if load < bestLoad { best = c; bestLoad = load }
            }
            if best == nil || (bestLoad >= streamsPerConnection && list.count < maxConnectionsPerLoop) {
                let fresh = PooledChannel(RPCChannel(configuration: configuration, group: loop), ownLoop: loop === fallbackLoop)
                list.append(fresh)
                map[key] = list
                best = fresh
            }
            best!.active.add(1, ordering: .relaxed)
            return best!
        }
    }

    func release(_ c: PooledChannel) { c.active.subtract(1, ordering: .relaxed) }

    /// ClientTransport for calls the gateway makes itself (health checks, token keys).
    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        let c = acquire()
        defer { release(c) }
        return try await c.channel.startCall(method, options: options)
    }

    /// Calls in flight through this pool.
    public var activeCalls: Int {
        byLoop.withLock { $0.values.joined().reduce(0) { $0 + $1.active.load(ordering: .relaxed) } }
    }

    /// Closes the connections on the pool's own loop; those on server loops close with the
    /// server's event loops.
    func close() async {
        guard !closed.exchange(true, ordering: .relaxed) else { return }
        let all = byLoop.withLock { m in
            defer { m = [:] }; return Array(m.values.joined())
        }
        for c in all where c.ownLoop { await c.channel.close() }
    }
}
