import NIOCore
import NIOHTTP1
import RPCCore

/// A handler the server's registry reaches while it is in the pipeline (from `handlerAdded`
/// until `handlerRemoved` or the connection's end), so a graceful shutdown reaches it. By
/// default a shutdown closes the connection; subclasses that may have a request in progress
/// override `beginGracefulShutdown`.
class RegisteredConnectionHandler: DrainableConnection {
    let shared: ServerShared
    private(set) var context: ChannelHandlerContext?

    init(shared: ServerShared) { self.shared = shared }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        shared.registry.add(self, loop: context.eventLoop)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        shared.registry.remove(self)
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        shared.registry.remove(self)
        context.fireChannelInactive()
    }

    func beginGracefulShutdown() { context?.close(promise: nil) }
    func forceClose() { context?.close(promise: nil) }
}

/// Decides per connection between HTTP/2 and HTTP/1.1 from the first bytes: the HTTP/2 client
/// preface (`PRI * HTTP/2.0…`) selects nghttp2, anything else NIOHTTP1. Works the same behind
/// TLS (it sits after the TLS handler and sees plaintext), so one port serves gRPC, h2c JSON and
/// HTTP/1.1 JSON alike.
/// Registered until it hands the connection over, so a shutdown also reaches connections that
/// have not sent enough to be told apart (they have no request in progress: closed).
final class ProtocolSniffer: RegisteredConnectionHandler, ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    private var buffered: ByteBuffer?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        if buffered == nil { buffered = incoming } else { buffered!.writeBuffer(&incoming) }
        let bytes = buffered!.readableBytesView
        let n = min(bytes.count, Self.preface.count)
        let isHTTP2Prefix = zip(bytes.prefix(n), Self.preface.prefix(n)).allSatisfy { $0 == $1 }
        if isHTTP2Prefix && n < Self.preface.count { return }  // need more bytes to decide
        do {
            let ops = context.pipeline.syncOperations
            if isHTTP2Prefix {
                try ops.addHandler(ServerConnectionHandler(shared: shared), position: .after(self))
            } else {
                try ops.configureHTTPServerPipeline(
                    position: .after(self), withPipeliningAssistance: true,
                    withErrorHandling: true)
                try ops.addHandler(HTTP1RequestHandler(shared: shared))
            }
        } catch {
            context.close(promise: nil)
            return
        }
        let data = buffered!
        buffered = nil
        context.fireChannelRead(wrapInboundOut(data))
        context.fireChannelReadComplete()
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }
}

/// Serves HTTP/1.1 requests with the server's `HTTPHandler` (one request at a time per
/// connection, keep-alive honoured, bodies capped at the request's limit: the handler's
/// `maxBodyBytes`, else the receive limit). Registered with the server so a graceful shutdown
/// answers the request in progress before closing. A connection is closed after any response
/// that says `connection: close`, after NIO's 400 for bytes that are not HTTP/1.1, and when it
/// stays idle (`http1IdleTimeout`: no request being handled and nothing read).
final class HTTP1RequestHandler: RegisteredConnectionHandler, ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private var head: HTTPRequestHead?
    /// The head's headers, names lower-cased (made once per request).
    private var headerPairs: [(name: String, value: String)] = []
    private var body: [UInt8] = []
    private var limit = 0
    /// The body is being discarded: refused already (413, 429), the connection closes after.
    private var refused = false
    /// Body bytes charged to the process budget (those past the small-message size).
    private var charged = 0
    /// A request is being read or handled (its response not written yet).
    private var busy = false
    /// The first request has been reported to the `ConnectionGuard` (which then leaves).
    private var sawRequest = false
    /// The handler is computing a response: not idle, whatever the socket does.
    private var handling = false
    /// Shutting down: answer what is in progress with `connection: close`, take nothing new.
    private var draining = false
    private var readSinceTick = true
    private var idleTicks = 0
    private var idleTimer: RepeatedTask?
    /// The task computing (or streaming) the current response: cancelled when the connection
    /// goes, so a stream's upstream call ends with the client.
    private var task: Task<Void, Never>?
    /// What a task-free answer (`handleImmediately`) started, cancelled when the connection goes.
    private var cancellation: CallCancellation?
    private var streaming = false

    override func beginGracefulShutdown() {
        draining = true
        if !busy { context?.close(promise: nil) }
        // A streamed response would hold the connection for as long as its stream lives:
        // ended now (the handler's cancellation ends its body), the connection closes after.
        if streaming { task?.cancel() }
    }

    override func handlerAdded(context: ChannelHandlerContext) {
        super.handlerAdded(context: context)
        // Idle: four quiet ticks in a row (closed within 1¼ of the timeout).
        if let idle = shared.configuration.http1IdleTimeout {
            let tick = TimeAmount(idle / 4)
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            idleTimer = context.eventLoop.scheduleRepeatedTask(initialDelay: tick, delay: tick) { _ in bound.value.idleTick() }
        }
    }

    override func handlerRemoved(context: ChannelHandlerContext) {
        stop()
        super.handlerRemoved(context: context)
    }

    override func channelInactive(context: ChannelHandlerContext) {
        stop()
        super.channelInactive(context: context)
    }

    private func stop() {
        idleTimer?.cancel()
        idleTimer = nil
        task?.cancel()
        task = nil
        cancellation?.cancel()
        cancellation = nil
        releaseCharge()
    }

    private func idleTick() {
        defer { readSinceTick = false }
        if readSinceTick || handling {
            idleTicks = 0
            return
        }
        idleTicks += 1
        if idleTicks >= 4 {
            shared.logger.debug("closing idle HTTP/1.1 connection")
            context?.close(promise: nil)
        }
    }

    private func releaseCharge() {
        if charged > 0 {
            shared.configuration.requestBudget.release(charged)
            charged = 0
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Bytes that are not HTTP/1.1: NIO's error handler has answered 400 with
        // `connection: close`; close now (the client would otherwise keep the socket open).
        shared.logger.debug("HTTP/1.1 error: \(error)")
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        readSinceTick = true
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body = []
            refused = false
            busy = true
            if !sawRequest {
                sawRequest = true
                context.triggerUserOutboundEvent(ConnectionGuard.RequestStarted(), promise: nil)
            }
            let config = shared.configuration
            limit =
                config.httpHandler?.maxBodyBytes(method: h.method.rawValue, path: HTTPRequest.path(of: h.uri))
                ?? config.maxReceiveMessageSize
            // A body declared too large is refused now, before it is read (the connection then
            // closes: the body that may follow is not read).
            let pairs = h.headers.map { ($0.name.lowercased(), $0.value) }
            headerPairs = pairs
            let peer = peer(context)
            let request = HTTPRequest(method: h.method.rawValue, target: h.uri, headers: pairs, body: [], peer: peer)
            if let declared = h.headers.first(name: "content-length").flatMap(Int.init), declared > limit {
                refuse(context, tooLarge(request), version: h.version)
            } else if let refusal = config.httpHandler?.respondAtHead(request) {
                // Refused from its head alone: the body is not read (the connection closes after).
                refuse(context, refusal, version: h.version)
            } else if h.version.minor >= 1, h.headers.first(name: "expect")?.lowercased() == "100-continue" {
                // The client waits for a go-ahead before the body (curl does for bodies over 1 MiB).
                context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: h.version, status: .continue))), promise: nil)
            }
        case .body(var chunk):
            guard !refused, let head else { return }
            let total = body.count + chunk.readableBytes
            if total > limit {
                let request = HTTPRequest(method: head.method.rawValue, target: head.uri, headers: headerPairs, body: [], peer: peer(context))
                return refuse(context, tooLarge(request), version: head.version)
            }
            let over = max(0, total - Int(HTTP2Setting.window(shared.configuration.initialWindowSize))) - charged
            if over > 0 {
                guard shared.configuration.requestBudget.tryCharge(over, limit: shared.configuration.maxBufferedRequestBytesPerProcess) else {
                    return refuse(context, .busy, version: head.version)
                }
                charged += over
            }
            if let bytes = chunk.readBytes(length: chunk.readableBytes) {
                body.append(contentsOf: bytes)
            }
        case .end:
            guard !refused, let head else { return }
            self.head = nil
            let keepAlive = head.isKeepAlive
            guard let handler = shared.configuration.httpHandler else {
                write(
                    context, HTTPResponse(status: 415, body: Array("this server speaks gRPC over HTTP/2 only\n".utf8)),
                    keepAlive: keepAlive, version: head.version)
                return
            }
            let request = HTTPRequest(
                method: head.method.rawValue, target: head.uri,
                headers: headerPairs, body: body,
                peer: peer(context))
            body = []
            releaseCharge()
            handling = true
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let boundContext = NIOLoopBound(context, eventLoop: context.eventLoop)
            let loop = context.eventLoop
            let version = head.version
            // Without a task when the handler can (a relayed unary call): it answers from a callback.
            let cancellation = CallCancellation()
            self.cancellation = cancellation
            let immediate = handler.handleImmediately(request, cancellation: cancellation) { response in
                loop.runOnLoop {
                    let (h, ctx) = bound.value
                    guard h.cancellation === cancellation else { return }
                    h.handling = false
                    h.cancellation = nil
                    h.write(ctx, response, keepAlive: keepAlive, version: version)
                }
            }
            if immediate { return }
            self.cancellation = nil
            task = Task(executorPreference: EventLoopTaskExecutor(loop)) {
                let response = await handler.handle(request)
                guard let body = response.stream else {
                    loop.runOnLoop {
                        let (h, ctx) = bound.value
                        h.handling = false
                        h.task = nil
                        h.write(ctx, response, keepAlive: keepAlive, version: version)
                    }
                    return
                }
                // A streamed body: the head now, then each write as a chunk, flushed.
                let started = await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
                    loop.runOnLoop {
                        let (h, ctx) = bound.value
                        guard ctx.channel.isActive, !Task.isCancelled else { return c.resume(returning: false) }
                        h.streaming = true
                        h.writeStreamHead(ctx, response, version: version)
                        if h.draining { h.task?.cancel() }  // the drain began while it waited for its head
                        c.resume(returning: true)
                    }
                }
                // Called even when the client went before the head: the writer then fails at
                // once, so whatever the handler started for the body is ended by it, not leaked.
                var completed = false
                do {
                    try await body(HTTP1BodyWriter(context: boundContext, loop: loop, usable: started))
                    completed = true
                } catch {}
                let reusable = keepAlive && completed && version.minor >= 1 && started
                loop.runOnLoop {
                    let (h, ctx) = bound.value
                    h.handling = false
                    h.streaming = false
                    h.task = nil
                    // HTTP/1.0 has no chunks: its body ends when the connection closes. A body
                    // that failed part-way closes too, so the client sees it cut short.
                    h.endStream(ctx, keepAlive: reusable)
                }
            }
        }
    }

    /// The head of a streamed response: chunked over HTTP/1.1, close-delimited over HTTP/1.0.
    private func writeStreamHead(_ context: ChannelHandlerContext, _ response: HTTPResponse, version: HTTPVersion) {
        var headers = HTTPHeaders()
        for (n, v) in response.headers where n != "content-length" { headers.add(name: n, value: v) }
        if version.minor >= 1 {
            headers.replaceOrAdd(name: "transfer-encoding", value: "chunked")
        } else {
            headers.replaceOrAdd(name: "connection", value: "close")
        }
        let status = HTTPResponseStatus(statusCode: response.status)
        context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: version, status: status, headers: headers))), promise: nil)
    }

    private func endStream(_ context: ChannelHandlerContext, keepAlive: Bool) {
        busy = false
        guard context.channel.isActive else { return }
        let done = context.writeAndFlushWithPromise(wrapOutboundOut(.end(nil)))
        if !keepAlive || draining {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
    }

    /// The client's address, described once per connection.
    private var describedPeer: String?
    private func peer(_ context: ChannelHandlerContext) -> String {
        if let describedPeer { return describedPeer }
        let p = context.channel.remoteAddress.map(ServerConnectionHandler.describe) ?? "unknown"
        describedPeer = p
        return p
    }

    private func tooLarge(_ request: HTTPRequest) -> HTTPResponse {
        shared.configuration.httpHandler?.bodyTooLarge(request, limit: limit) ?? .bodyTooLarge(limit: limit)
    }

    /// Answers now and closes: the rest of the request is not read.
    private func refuse(_ context: ChannelHandlerContext, _ response: HTTPResponse, version: HTTPVersion) {
        refused = true
        head = nil
        body = []
        releaseCharge()
        write(context, response, keepAlive: false, version: version)
    }

    private func write(_ context: ChannelHandlerContext, _ response: HTTPResponse, keepAlive: Bool, version: HTTPVersion) {
        busy = false
        let keepAlive = keepAlive && !draining
        var headers = HTTPHeaders()
        for (n, v) in response.headers { headers.add(name: n, value: v) }
        headers.replaceOrAdd(name: "content-length", value: String(response.body.count))
        headers.replaceOrAdd(name: "connection", value: keepAlive ? "keep-alive" : "close")
        let status = HTTPResponseStatus(statusCode: response.status)
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: version, status: status, headers: headers))), promise: nil)
        if !response.body.isEmpty {
            var buffer = context.channel.allocator.buffer(capacity: response.body.count)
            buffer.writeBytes(response.body)
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        }
        let done = context.writeAndFlushWithPromise(wrapOutboundOut(.end(nil)))
        if !keepAlive {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
    }
}

/// A streamed HTTP/1.1 response body (`HTTPResponse.stream`): each write one chunk, flushed; the
/// next write waits until the socket took the previous one (a slow client holds the writer back).
struct HTTP1BodyWriter: HTTPBodyWriter {
    let context: NIOLoopBound<ChannelHandlerContext>
    let loop: any EventLoop
    /// False when the head never went out (the client had gone): every write fails.
    let usable: Bool

    func write(_ bytes: [UInt8]) async throws {
        guard usable else { throw RPCError.cancelled("the client has gone") }
        let context = self.context
        let written: EventLoopFuture<Void> = loop.flatSubmit {
            let ctx = context.value
            guard ctx.channel.isActive else { return ctx.eventLoop.makeFailedFuture(RPCError.cancelled("the client has gone")) }
            var buffer = ctx.channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            let p = ctx.eventLoop.makePromise(of: Void.self)
            ctx.writeAndFlush(NIOAny(HTTPServerResponsePart.body(.byteBuffer(buffer))), promise: p)
            return p.futureResult
        }
        do { try await written.get() } catch { throw RPCError.cancelled("the client has gone") }
    }
}

extension ChannelHandlerContext {
    fileprivate func writeAndFlushWithPromise(_ data: NIOAny) -> EventLoopFuture<Void> {
        let p = eventLoop.makePromise(of: Void.self)
        writeAndFlush(data, promise: p)
        return p.futureResult
    }
}

extension HTTPResponse {
    /// 429 for a large body while the process holds its budget of request bytes.
    static let busy = HTTPResponse(
        status: 429, headers: [("content-type", "text/plain"), ("retry-after", "1")],
        body: Array("the server is busy receiving other large requests: retry shortly\n".utf8))
}
