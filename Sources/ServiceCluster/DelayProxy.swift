import NIOCore
import NIOPosix
import Synchronization

/// A TCP proxy on 127.0.0.1 in front of a real service: every chunk of bytes, each way, is held
/// for `delay` before it is passed on (in order). A slow network between two services, for tests
/// of deadlines; not a stand-in: the bytes reach the real service unchanged. Its upstream can be
/// moved (`setUpstream`): the stable address of a service process a test kills and starts again
/// (each start on a port of its own, never a freed port bound again).
public final class DelayProxy: Sendable {
    /// The port peers connect to instead of the service's own.
    public let port: Int
    private let listener: any Channel

    /// Listens on 127.0.0.1:0 and forwards every connection to 127.0.0.1:`upstreamPort` (nil:
    /// none yet, every connection is closed at once, as a service that is not running refuses).
    public init(upstreamPort: Int?, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws {
        let delay = Delay()
        let registry = Registry()
        let upstream = Upstream(upstreamPort)
        let listener = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { inbound in
                guard let upstreamPort = upstream.port else { return inbound.eventLoop.makeFailedFuture(Upstream.None()) }
                let toUpstream = Forwarder(delay: delay)
                do { try inbound.pipeline.syncOperations.addHandler(toUpstream) } catch {
                    return inbound.eventLoop.makeFailedFuture(error)
                }
                let bound = NIOLoopBound(toUpstream, eventLoop: inbound.eventLoop)
                return ClientBootstrap(group: inbound.eventLoop)
                    .channelOption(.socketOption(.tcp_nodelay), value: 1)
                    .channelInitializer { outbound in
                        outbound.eventLoop.makeCompletedFuture {
                            try outbound.pipeline.syncOperations.addHandler(Forwarder(delay: delay, partner: inbound))
                        }
                    }
                    .connect(host: "127.0.0.1", port: upstreamPort)
                    .map { outbound in
                        bound.value.connected(to: outbound)
                        registry.add(inbound)
                        registry.add(outbound)
                    }
                    .flatMapErrorThrowing { error in
                        inbound.close(promise: nil)
                        throw error
                    }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        self.listener = listener
        self.port = listener.localAddress?.port ?? 0
        self.delay = delay
        self.registry = registry
        self.upstream = upstream
    }

    private let delay: Delay
    private let registry: Registry
    private let upstream: Upstream

    /// New connections go to 127.0.0.1:`port` from now on (nil: closed at once); the ones already
    /// forwarded stay with the old upstream until either side closes them.
    public func setUpstream(_ port: Int?) { upstream.port = port }

    final class Upstream: Sendable {
        struct None: Error {}
        private let value: Atomic<Int>
        init(_ port: Int?) { value = Atomic(port ?? 0) }
        var port: Int? {
            get {
                let p = value.load(ordering: .acquiring)
                return p > 0 ? p : nil
            }
            set { value.store(newValue ?? 0, ordering: .releasing) }
        }
    }

    /// How long each chunk waits (zero: passed on at once, still in order).
    public func setDelay(_ d: Duration) { delay.set(d) }

    /// Stops listening and closes every forwarded connection.
    public func close() async {
        try? await listener.close()
        for c in registry.all() { try? await c.close() }
    }

    final class Delay: Sendable {
        private let nanoseconds = Atomic<Int64>(0)
        func set(_ d: Duration) {
            let (s, a) = d.components
            nanoseconds.store(s * 1_000_000_000 + a / 1_000_000_000, ordering: .relaxed)
        }
        var amount: TimeAmount { .nanoseconds(nanoseconds.load(ordering: .relaxed)) }
    }

    final class Registry: Sendable {
        private let channels = Mutex<[any Channel]>([])
        func add(_ c: any Channel) {
            channels.withLock { list in
                list.removeAll { !$0.isActive }
                list.append(c)
            }
        }
        func all() -> [any Channel] { channels.withLock { $0 } }
    }

    /// Reads one side and writes to the other after the delay. Chunks keep their order: each is
    /// due no earlier than the one before. Until the upstream connection is made, chunks wait.
    final class Forwarder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let delay: Delay
        var partner: (any Channel)?
        var waiting: [(ByteBuffer, NIODeadline)] = []
        var last = NIODeadline.uptimeNanoseconds(0)
        var closedEarly = false

        init(delay: Delay, partner: (any Channel)? = nil) {
            self.delay = delay
            self.partner = partner
        }

        func connected(to channel: any Channel) {
            partner = channel
            for (buffer, due) in waiting { schedule(buffer, due, on: channel.eventLoop) }
            waiting = []
            if closedEarly { closePartner() }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            let due = max(NIODeadline.now() + delay.amount, last)
            last = due
            guard let partner else {
                waiting.append((buffer, due))
                return
            }
            schedule(buffer, due, on: partner.eventLoop)
        }

        private func schedule(_ buffer: ByteBuffer, _ due: NIODeadline, on loop: any EventLoop) {
            guard let partner else { return }
            loop.scheduleTask(deadline: due) { partner.writeAndFlush(buffer, promise: nil) }
        }

        private func closePartner() {
            guard let partner else { return }
            let due = max(NIODeadline.now() + delay.amount, last)
            partner.eventLoop.scheduleTask(deadline: due) { partner.close(promise: nil) }
        }

        func channelInactive(context: ChannelHandlerContext) {
            if partner == nil { closedEarly = true } else { closePartner() }
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
