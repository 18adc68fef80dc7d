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
    /// The upstream's name (`accounts`), for what clients are told about it.
    let upstream: String
    init(_ channel: RPCChannel, ownLoop: Bool, upstream: String) {
        self.channel = channel
        self.ownLoop = ownLoop
        self.upstream = upstream
    }

    /// A call's status as the gateway answers it. One the upstream sent (`fromPeer`:
    /// `RawClientCall.statusCameFromPeer`) passes as it is. One the transport made (the call
    /// never reached the upstream, the connection was lost or reset, a deadline) is worded for
    /// clients: the upstream named, its address and the transport's inner errors kept out. The
    /// reason is for the operators: the health poll logs it when the upstream stops serving,
    /// and `GatewayHealth.failure(upstream:)` holds it.
    func worded(_ status: RPCStatus, fromPeer: Bool) -> RPCStatus {
        guard !fromPeer else { return status }
        if status.code == .unavailable { return RPCStatus(.unavailable, "\(upstream) is unavailable right now: try again shortly") }
        let address = channel.configuration.target
        guard status.message.contains(address) else { return status }
        return RPCStatus(status.code, status.message.replacingOccurrences(of: address, with: upstream))
    }

    /// Gives back a stream `UpstreamPool.acquire` counted (a relayed call holds only its lease,
    /// not the pool: both event loops' calls retaining the one pool object would move its
    /// reference count's cache line between the cores on every call).
    func released() { active.subtract(1, ordering: .relaxed) }
}

/// Connections to one upstream service. Calls started on one of the gateway's event loops use a
/// connection living on that same loop, so proxying a call never hops threads; each loop opens
/// more connections when its streams pass `streamsPerConnection` (the upstream caps concurrent
/// streams per connection, and long-lived streams must not starve new calls). Calls from
/// elsewhere (health polls, key fetches) use connections on the pool's own loop.
///
/// Each serving loop has a slot of its own, found without a lock (the map is fixed at start),
/// so the loops never wait for each other here: one shared lock was contended on every call
/// (futex waits were about a quarter of a relayed call's kernel time with two loops).
public final class UpstreamPool: ClientTransport, Sendable {
    public let name: String
    let configuration: ChannelConfiguration
    let streamsPerConnection: Int
    let maxConnectionsPerLoop: Int
    private let fallbackLoop: any EventLoop

    /// One loop's connections. Its lock is taken by that loop, and rarely by others (counts, close).
    final class Slot: Sendable {
        let loop: any EventLoop
        let channels = Mutex<[PooledChannel]>([])
        /// The connection this loop's last call got, read and written only on the loop itself
        /// (a serving slot is chosen only there: `slot()`), so the usual call takes no lock: while
        /// it has room, the next call goes to it too. Never cleared (a closed channel answers
        /// UNAVAILABLE, as at shutdown).
        nonisolated(unsafe) var recent: PooledChannel?
        init(loop: any EventLoop) { self.loop = loop }
    }
    /// The serving loops' slots, fixed at init: one per core, found by a scan of their loops'
    /// identities (a dictionary hashed the loop's identity with SipHash on every call).
    private let slots: [Slot]
    private let slotLoops: [ObjectIdentifier]
    /// Calls from anywhere else (tasks, other groups' loops).
    private let fallbackSlot: Slot
    private let closed = Atomic<Bool>(false)

    /// - Parameter loops: the loops calls are started on (the server's); calls from elsewhere
    ///   use connections on `fallbackLoop`.
    init(
        name: String, configuration: ChannelConfiguration, loops: [any EventLoop], fallbackLoop: any EventLoop,
        streamsPerConnection: Int = 90, maxConnectionsPerLoop: Int
    ) {
        self.name = name
        self.configuration = configuration
        self.fallbackLoop = fallbackLoop
        self.streamsPerConnection = max(1, streamsPerConnection)
        self.maxConnectionsPerLoop = max(1, maxConnectionsPerLoop)
        fallbackSlot = Slot(loop: fallbackLoop)
        var seen = Set<ObjectIdentifier>()
        let serving = loops.filter { $0 !== fallbackLoop && seen.insert(ObjectIdentifier($0)).inserted }
        self.slots = serving.map { Slot(loop: $0) }
        self.slotLoops = serving.map { ObjectIdentifier($0) }
    }

    /// The calling loop's slot (the pool's own loop's when the caller is not on a serving loop).
    private func slot() -> Slot {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop else { return fallbackSlot }
        let id = ObjectIdentifier(loop)
        for i in slotLoops.indices where slotLoops[i] == id { return slots[i] }
        return fallbackSlot
    }

    /// A connection for a new call, its active count already raised (lower it with `released()`).
    /// Throws UNAVAILABLE when every connection this loop may open carries its full share of
    /// streams: a further stream would wait, silently, inside the connection until another
    /// ended (for a subscription, indefinitely).
    func acquire() throws(RPCError) -> PooledChannel {
        let slot = slot()
        let serving = slot !== fallbackSlot
        if serving, let c = slot.recent, c.active.load(ordering: .relaxed) < streamsPerConnection {
            c.active.add(1, ordering: .relaxed)
            return c
        }
        let chosen: PooledChannel? = slot.channels.withLock { list in
            var best: PooledChannel? = nil
            for c in list where c.active.load(ordering: .relaxed) < streamsPerConnection {
                best = c
                break
            }
            if best == nil {
                guard list.count < maxConnectionsPerLoop else { return nil }
                let fresh = PooledChannel(
                    RPCChannel(configuration: configuration, group: slot.loop), ownLoop: slot.loop === fallbackLoop, upstream: name)
                list.append(fresh)
                best = fresh
            }
            best!.active.add(1, ordering: .relaxed)
            return best!
        }
        guard let chosen else {
            throw RPCError(
                .unavailable,
                "the gateway holds as many calls to \(name) as it may (\(maxConnectionsPerLoop) connections × \(streamsPerConnection) streams per event loop): retry shortly"
            )
        }
        if serving { slot.recent = chosen }
        return chosen
    }

    /// ClientTransport for calls the gateway makes itself (health checks, token keys).
    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        let c = try acquire()
        defer { c.released() }
        return try await c.channel.startCall(method, options: options)
    }

    private var allSlots: [Slot] { [fallbackSlot] + slots }

    var allChannels: [PooledChannel] { allSlots.flatMap { s in s.channels.withLock { $0 } } }

    /// Calls in flight through this pool.
    public var activeCalls: Int { allChannels.reduce(0) { $0 + $1.active.load(ordering: .relaxed) } }

    /// Closes the connections on the pool's own loop; those on server loops close with the
    /// server's event loops.
    func close() async {
        guard !closed.exchange(true, ordering: .relaxed) else { return }
        // Each slot taken and emptied in one step: a channel added meanwhile is not dropped unclosed.
        let all = allSlots.flatMap { s in
            s.channels.withLock { list in
                defer { list = [] }
                return list
            }
        }
        for c in all where c.ownLoop { await c.channel.close() }
    }
}
