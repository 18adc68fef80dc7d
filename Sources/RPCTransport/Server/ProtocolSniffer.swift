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
                try ops.configureHTTPServerPipeline(position: .after(self), withPipeliningAssistance: true,
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
/// connection, keep-alive honoured, bodies capped at the receive limit). Registered with the
/// server so a graceful shutdown answers the request in progress before closing.
final class HTTP1RequestHandler: RegisteredConnectionHandler, ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    private var tooLarge = false
    /// A request is being read or handled (its response not written yet).
    private var busy = false
    /// Shutting down: answer what is in progress with `connection: close`, take nothing new.
    private var draining = false

    override func beginGracefulShutdown() {
        draining = true
        if !busy { context?.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body = []
            tooLarge = false
            busy = true
            if h.version.minor >= 1, h.headers.first(name: "expect")?.lowercased() == "100-continue" {
                // The client waits for a go-ahead before the body (curl does for bodies over 1 MiB).
                // A body declared too large is refused now; the rest get "100 Continue".
                if let declared = h.headers.first(name: "content-length").flatMap(Int.init),
                   declared > shared.configuration.maxReceiveMessageSize {
                    head = nil
                    write(context, .bodyTooLarge(limit: shared.configuration.maxReceiveMessageSize), keepAlive: false, version: h.version)
                } else {
                    context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: h.version, status: .continue))), promise: nil)
                }
            }
        case .body(var chunk):
            if body.count + chunk.readableBytes > shared.configuration.maxReceiveMessageSize {
                tooLarge = true
            } else if let bytes = chunk.readBytes(length: chunk.readableBytes) {
                body.append(contentsOf: bytes)
            }
        case .end:
            guard let head else { return }
            self.head = nil
            let keepAlive = head.isKeepAlive
            if tooLarge {
                write(context, .bodyTooLarge(limit: shared.configuration.maxReceiveMessageSize), keepAlive: false, version: head.version)
                return
            }
            guard let handler = shared.configuration.httpHandler else {
                write(context, HTTPResponse(status: 415, body: Array("this server speaks gRPC over HTTP/2 only\n".utf8)),
                      keepAlive: keepAlive, version: head.version)
                return
            }
            let request = HTTPRequest(
                method: head.method.rawValue, target: head.uri,
                headers: head.headers.map { ($0.name.lowercased(), $0.value) }, body: body,
                peer: context.channel.remoteAddress.map(ServerConnectionHandler.describe) ?? "unknown")
            body = []
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let loop = context.eventLoop
            let version = head.version
            Task(executorPreference: EventLoopTaskExecutor(loop)) {
                let response = await handler.handle(request)
                loop.runOnLoop {
                    let (h, ctx) = bound.value
                    h.write(ctx, response, keepAlive: keepAlive, version: version)
                }
            }
        }
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

extension ChannelHandlerContext {
    fileprivate func writeAndFlushWithPromise(_ data: NIOAny) -> EventLoopFuture<Void> {
        let p = eventLoop.makePromise(of: Void.self)
        writeAndFlush(data, promise: p)
        return p.futureResult
    }
}

extension HTTPResponse {
    /// 413 for a plain-HTTP request body over the server's receive limit (HTTP/1.1 and HTTP/2).
    static func bodyTooLarge(limit: Int) -> HTTPResponse {
        HTTPResponse(status: 413, headers: [("content-type", "text/plain")], body: Array("request body exceeds \(limit) bytes\n".utf8))
    }
}
