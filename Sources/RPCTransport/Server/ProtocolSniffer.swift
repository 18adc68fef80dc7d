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
                let watch = ChunkedBodyWatch()
                try ops.addHandler(watch, position: .after(self))
                try ops.configureHTTPServerPipeline(
                    position: .after(watch), withPipeliningAssistance: true,
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
///
/// An answer sent before the body was read (a refusal from the head, a body over its limit,
/// declared or growing) does not close the connection under a client still sending: the kernel
/// would reset it, and the client's write would fail before it read the answer (browsers then
/// report a network error instead of the status). The rest of the body is read and dropped: a
/// small declared body (`keepAliveDiscardBytes`) keeps the connection; otherwise the answer says
/// `connection: close`, the server half-closes its side once it is written, and reads on until
/// the body ends, the client closes, nothing arrives for `lingerIdle`, `lingerTime` passes or
/// `lingerBytes` were dropped (nginx's lingering close). CONNECT (this server tunnels nothing) is
/// answered 501 and the connection closed: NIO's decoder reads no further request after one, and
/// its encoder gives the answer no length.
final class HTTP1RequestHandler: RegisteredConnectionHandler, ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private var head: HTTPRequestHead?
    /// The head's headers, names lower-cased (made once per request).
    private var headerPairs: [(name: String, value: String)] = []
    private var body: [UInt8] = []
    private var limit = 0
    /// What becomes of the rest of a body answered before it was read.
    private enum Discard {
        case none
        /// Read and dropped; the connection serves the next request.
        case keepingAlive
        /// Read and dropped within the linger bounds; the connection closes at its end.
        case lingering
    }
    private var discard = Discard.none
    /// NIO's error handler has answered (a 400): nothing more is written.
    private var broken = false
    private var discarded = 0
    /// The early answer's write (the connection closes only after it).
    private var answered: EventLoopFuture<Void>?
    private var lingerTimer: RepeatedTask?
    private var lingerTicks = 0
    private var quietLingerTicks = 0
    private var readSinceLingerTick = false
    /// Request heads seen, and chunked bodies' declared sizes reported for requests whose heads
    /// the pipelining handler still holds.
    private var requestsSeen = 0
    private var declaredAhead: [Int: Int] = [:]

    /// A declared body up to this size is read and dropped after an early answer, and the
    /// connection kept: cheaper for both sides than a new connection.
    static let keepAliveDiscardBytes = 64 * 1024
    /// Bounds of a lingering close (nginx: `lingering_timeout` 5 s, `lingering_time` 30 s).
    static let lingerIdle = 5
    static let lingerTime = 30
    static let lingerBytes = 16 << 20
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
        lingerTimer?.cancel()
        lingerTimer = nil
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
        broken = true
        head = nil
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        readSinceTick = true
        readSinceLingerTick = true
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body = []
            discard = .none
            requestsSeen += 1
            busy = true
            if !sawRequest {
                sawRequest = true
                context.triggerUserOutboundEvent(ConnectionGuard.RequestStarted(), promise: nil)
            }
            let config = shared.configuration
            limit =
                config.httpHandler?.maxBodyBytes(method: h.method.rawValue, path: HTTPRequest.path(of: h.uri))
                ?? config.maxReceiveMessageSize
            // A body declared too large is refused now, before it is read (and then dropped).
            let pairs = h.headers.map { ($0.name.lowercased(), $0.value) }
            headerPairs = pairs
            let peer = peer(context)
            let request = HTTPRequest(method: h.method.rawValue, target: h.uri, headers: pairs, body: [], peer: peer)
            if h.method == .CONNECT {
                refuse(context, .connectRefused, head: h)
            } else if let declared = h.headers.first(name: "content-length").flatMap(Int.init), declared > limit {
                refuse(context, tooLarge(request), head: h)
            } else if let refusal = config.httpHandler?.respondAtHead(request) {
                // Refused from its head alone: the body is read and dropped.
                refuse(context, refusal, head: h)
            } else if let declared = declaredAhead.removeValue(forKey: requestsSeen), declared > limit {
                refuse(context, tooLarge(request), head: h)
            } else if h.version.minor >= 1, h.headers.first(name: "expect")?.lowercased() == "100-continue" {
                // The client waits for a go-ahead before the body (curl does for bodies over 1 MiB).
                context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: h.version, status: .continue))), promise: nil)
            }
        case .body(var chunk):
            if discard != .none { return dropped(context, chunk.readableBytes) }
            guard let head else { return }
            let total = body.count + chunk.readableBytes
            if total > limit {
                let request = HTTPRequest(method: head.method.rawValue, target: head.uri, headers: headerPairs, body: [], peer: peer(context))
                return refuse(context, tooLarge(request), head: head)
            }
            let over = max(0, total - Int(HTTP2Setting.window(shared.configuration.initialWindowSize))) - charged
            if over > 0 {
                guard shared.configuration.requestBudget.tryCharge(over, limit: shared.configuration.maxBufferedRequestBytesPerProcess) else {
                    return refuse(context, .busy, head: head)
                }
                charged += over
            }
            if let bytes = chunk.readBytes(length: chunk.readableBytes) {
                body.append(contentsOf: bytes)
            }
        case .end:
            switch discard {
            case .none: break
            case .keepingAlive:
                discard = .none
                return
            case .lingering:
                // The whole body was read: closing now resets nothing.
                return closeAfterAnswer(context)
            }
            guard let head else { return }
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

    /// Answers now, before the rest of the body is read; the body is then read and dropped (see
    /// the type's comment): the connection is kept when the declared body is small, else it
    /// lingers and closes.
    private func refuse(_ context: ChannelHandlerContext, _ response: HTTPResponse, head: HTTPRequestHead) {
        self.head = nil
        body = []
        releaseCharge()
        // A request with neither length nor chunks has no body.
        let chunked = head.headers[canonicalForm: "transfer-encoding"].last?.lowercased() == "chunked"
        let declared = head.headers.first(name: "content-length").flatMap(Int.init) ?? (chunked ? nil : 0)
        let keep =
            head.isKeepAlive && head.version.minor >= 1 && !draining && head.method != .CONNECT
            && declared.map { $0 <= Self.keepAliveDiscardBytes } == true
            && head.headers.first(name: "expect")?.lowercased() != "100-continue"
        discard = keep ? .keepingAlive : .lingering
        discarded = 0
        answered = write(context, response, keepAlive: keep, version: head.version, close: false)
        guard !keep else { return }
        if head.method == .CONNECT { return closeAfterAnswer(context) }
        // Our side is done: the FIN tells a client that waits for the connection's end that the
        // answer is whole. A channel that cannot half-close just stays open until the close.
        let channel = context.channel
        answered?.whenComplete { _ in channel.close(mode: .output, promise: nil) }
        lingerTicks = 0
        quietLingerTicks = 0
        readSinceLingerTick = false
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        lingerTimer = context.eventLoop.scheduleRepeatedTask(initialDelay: .seconds(1), delay: .seconds(1)) { _ in
            bound.value.lingerTick()
        }
    }

    /// Body bytes after an early answer: dropped, within the linger's byte bound.
    private func dropped(_ context: ChannelHandlerContext, _ count: Int) {
        discarded += count
        if discard == .lingering, discarded > Self.lingerBytes { closeAfterAnswer(context) }
    }

    private func lingerTick() {
        lingerTicks += 1
        quietLingerTicks = readSinceLingerTick ? 0 : quietLingerTicks + 1
        readSinceLingerTick = false
        guard quietLingerTicks >= Self.lingerIdle || lingerTicks >= Self.lingerTime, let context else { return }
        shared.logger.debug("closing an HTTP/1.1 connection whose refused body did not end")
        closeAfterAnswer(context)
    }

    private func closeAfterAnswer(_ context: ChannelHandlerContext) {
        lingerTimer?.cancel()
        lingerTimer = nil
        discard = .none
        let channel = context.channel
        if let answered {
            answered.whenComplete { _ in channel.close(promise: nil) }
        } else {
            channel.close(promise: nil)
        }
    }

    @discardableResult
    private func write(
        _ context: ChannelHandlerContext, _ response: HTTPResponse, keepAlive: Bool, version: HTTPVersion, close: Bool = true
    ) -> EventLoopFuture<Void> {
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
        if !keepAlive && close {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
        return done
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let declared = event as? ChunkedBodyDeclared else { return context.fireUserInboundEventTriggered(event) }
        if declared.request > requestsSeen {
            // Its head waits in the pipelining handler: checked when it arrives.
            if declaredAhead.count < 16 { declaredAhead[declared.request] = declared.bytes }
            return
        }
        guard !broken, declared.request == requestsSeen, discard == .none, let head, declared.bytes > limit else { return }
        let request = HTTPRequest(method: head.method.rawValue, target: head.uri, headers: headerPairs, body: [], peer: peer(context))
        refuse(context, tooLarge(request), head: head)
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
    /// CONNECT: this server is no proxy.
    static let connectRefused = HTTPResponse(
        status: 501, headers: [("content-type", "text/plain")], body: Array("CONNECT is not supported: this server is not a proxy\n".utf8))

    /// 429 for a large body while the process holds its budget of request bytes.
    static let busy = HTTPResponse(
        status: 429, headers: [("content-type", "text/plain"), ("retry-after", "1")],
        body: Array("the server is busy receiving other large requests: retry shortly\n".utf8))
}

/// Follows the framing of the HTTP/1.1 requests on a connection, ahead of NIO's decoder, to
/// report each chunked body's declared size as its chunk-size lines arrive
/// (`ChunkedBodyDeclared`): NIO passes body bytes on but not the sizes, so a client that declares
/// a chunk of `ffffffffffffffff` and then waits would otherwise hold its request until the idle
/// timeout. It reads heads (lines up to the empty one), skips `content-length` bodies and chunk
/// data, and stops following (passes bytes on unread) after a request whose framing it does not
/// know (an upgrade, CONNECT) or a line past 64 KiB: the decoder refuses what is malformed.
final class ChunkedBodyWatch: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private enum State {
        case head
        case body(Int)
        case chunkSize
        case chunkLine
        case chunkData(Int)
        case chunkDataEnd
        case trailers
        case off
    }
    private var state = State.head
    private var line: [UInt8] = []
    /// Request heads seen (the n-th request's events carry n).
    private var requests = 0
    /// The current head: whether a request line came, and what framing its headers name.
    private var sawRequestLine = false
    private var chunked = false
    private var contentLength = 0
    private var noFraming = false
    /// The current chunk's size so far, saturating; the body's declared total, saturating.
    private var size = 0
    private var sizeDigits = 0
    private var total = 0
    private static let maxLine = 64 * 1024

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        var events: [ChunkedBodyDeclared] = []
        buffer.withUnsafeReadableBytes { scan($0, &events) }
        context.fireChannelRead(data)
        for e in events { context.fireUserInboundEventTriggered(e) }
    }

    private func scan(_ bytes: UnsafeRawBufferPointer, _ events: inout [ChunkedBodyDeclared]) {
        var i = 0
        let n = bytes.count
        while i < n {
            switch state {
            case .off:
                return
            case .body(let left):
                let k = min(left, n - i)
                i += k
                state = left - k == 0 ? .head : .body(left - k)
            case .chunkData(let left):
                let k = min(left, n - i)
                i += k
                state = left - k == 0 ? .chunkDataEnd : .chunkData(left - k)
            case .chunkDataEnd:
                if bytes[i] == 10 { state = .chunkSize; size = 0; sizeDigits = 0 }
                i += 1
            case .chunkSize:
                let b = bytes[i]
                i += 1
                if let v = Self.hex(b) {
                    sizeDigits += 1
                    size = size > (Int.max >> 4) ? Int.max : size << 4 | v
                } else if sizeDigits == 0 {
                    state = .off  // not a chunk size: the decoder refuses it
                } else if b == 10 {
                    endSizeLine(&events)
                } else {
                    state = .chunkLine  // extensions, whitespace, CR
                }
            case .chunkLine:
                if bytes[i] == 10 { endSizeLine(&events) }
                i += 1
            case .head, .trailers:
                let b = bytes[i]
                i += 1
                if b != 10 {
                    line.append(b)
                    if line.count > Self.maxLine { state = .off }
                    continue
                }
                if line.last == 13 { line.removeLast() }
                if case .trailers = state {
                    if line.isEmpty { state = .head }
                } else {
                    headLine()
                }
                line.removeAll(keepingCapacity: true)
            }
        }
    }

    private func endSizeLine(_ events: inout [ChunkedBodyDeclared]) {
        if size == 0 {
            state = .trailers
            return
        }
        total = total > Int.max - size ? Int.max : total + size
        events.append(ChunkedBodyDeclared(request: requests, bytes: total))
        state = .chunkData(size)
    }

    /// A complete line of a request head.
    private func headLine() {
        guard sawRequestLine else {
            if line.isEmpty { return }  // empty lines before a request line are skipped
            sawRequestLine = true
            requests += 1
            chunked = false
            contentLength = 0
            noFraming = Self.hasPrefix(line, "CONNECT ")
            return
        }
        if line.isEmpty {
            sawRequestLine = false
            if noFraming {
                state = .off
            } else if chunked {
                state = .chunkSize
                size = 0
                sizeDigits = 0
                total = 0
            } else if contentLength > 0 {
                state = .body(contentLength)
            }
            return
        }
        guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { return }
        let value = line[(colon + 1)...].filter { $0 != 32 && $0 != 9 }.map { $0 | 0x20 }
        if Self.named(line, colon, "transfer-encoding") {
            // The last coding decides (`gzip, chunked`); a later field overrides an earlier one.
            chunked = value.split(separator: UInt8(ascii: ",")).last.map { Array($0) == Array("chunked".utf8) } ?? false
        } else if Self.named(line, colon, "content-length") {
            contentLength = Int(String(decoding: value, as: UTF8.self)) ?? 0
        } else if Self.named(line, colon, "upgrade") {
            noFraming = true
        }
    }

    private static func hex(_ b: UInt8) -> Int? {
        switch b {
        case 48...57: Int(b - 48)
        case 65...70: Int(b - 55)
        case 97...102: Int(b - 87)
        default: nil
        }
    }

    private static func hasPrefix(_ line: [UInt8], _ prefix: String) -> Bool {
        line.count >= prefix.utf8.count && zip(line, prefix.utf8).allSatisfy { $0 == $1 }
    }

    private static func named(_ line: [UInt8], _ colon: Int, _ name: String) -> Bool {
        colon == name.utf8.count && zip(line, name.utf8).allSatisfy { $0 | 0x20 == $1 }
    }
}

/// A chunked request body has declared `bytes` so far (the n-th request on the connection).
struct ChunkedBodyDeclared: Sendable {
    let request: Int
    let bytes: Int
}
