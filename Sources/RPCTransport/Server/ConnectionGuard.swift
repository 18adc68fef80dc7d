import Logging
import NIOCore
import Synchronization

/// The first handler of every accepted connection (before TLS): enforces the server's cap on
/// open connections and the time a connection may take to send its first complete request
/// headers (`ServerConfiguration.maxConnections`, `firstRequestTimeout`), whatever protocol it
/// turns out to speak. The protocol handlers tell it a request arrived with the outbound user
/// event `RequestStarted` (outbound events travel towards the head, where it sits); it then leaves
/// the pipeline, and the channel's close releases the connection's place in the count.
final class ConnectionGuard: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Sent by a protocol handler when complete request headers arrived.
    struct RequestStarted {}

    let shared: ServerShared
    private var counted = false
    private var timer: Scheduled<Void>?
    /// Out of the pipeline since the first request; the channel's close releases the count.
    private var leftAfterFirstRequest = false

    init(shared: ServerShared) { self.shared = shared }

    func channelActive(context: ChannelHandlerContext) {
        let config = shared.configuration
        guard shared.connections.admit(limit: config.maxConnections) else {
            shared.connections.noteRefused(logger: shared.logger, limit: config.maxConnections)
            context.close(promise: nil)
            return
        }
        counted = true
        shared.configuration.observer?.connection(opened: true)
        if let timeout = config.firstRequestTimeout {
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            let logger = shared.logger
            timer = context.eventLoop.scheduleTask(in: TimeAmount(timeout)) {
                logger.debug("closing a connection that sent no request within \(timeout)")
                bound.value.close(promise: nil)
            }
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // Removed after the first request: the close releases the count (below).
        if !leftAfterFirstRequest { release() }
    }

    private func release() {
        timer?.cancel()
        timer = nil
        if counted {
            counted = false
            shared.connections.release()
            shared.configuration.observer?.connection(opened: false)
        }
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if event is RequestStarted {
            timer?.cancel()
            timer = nil
            promise?.succeed()
            // What is left to do is the count's release at the close: the guard leaves the
            // pipeline, so the connection's reads, writes and flushes stop passing through it
            // (each pass is a handler hop, ≈ 130 instructions, five a relayed call). The close
            // future completes one loop turn after `channelInactive`, where the release was: a
            // place under the cap is free that much later.
            if counted && !leftAfterFirstRequest {
                leftAfterFirstRequest = true
                let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
                context.channel.closeFuture.whenComplete { _ in bound.value.release() }
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            }
            return
        }
        context.triggerUserOutboundEvent(event, promise: promise)
    }
}

/// Open connections of one server, and the refusals past its cap (logged at most every 10 s).
final class ConnectionCounter: Sendable {
    private let open = Atomic<Int>(0)
    private let refused = Atomic<Int>(0)
    private let lastLog = Mutex<ContinuousClock.Instant?>(nil)

    func admit(limit: Int) -> Bool {
        if open.wrappingAdd(1, ordering: .relaxed).newValue <= limit { return true }
        open.wrappingSubtract(1, ordering: .relaxed)
        return false
    }

    func release() { open.wrappingSubtract(1, ordering: .relaxed) }

    var count: Int { open.load(ordering: .relaxed) }

    func noteRefused(logger: Logger, limit: Int) {
        refused.wrappingAdd(1, ordering: .relaxed)
        let now = ContinuousClock.now
        let due = lastLog.withLock { last -> Bool in
            if let l = last, now - l < .seconds(10) { return false }
            last = now
            return true
        }
        if due {
            let n = refused.exchange(0, ordering: .relaxed)
            logger.warning("refused \(n) connection(s): \(limit) connections are open (maxConnections)")
        }
    }
}
