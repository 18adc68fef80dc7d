import NIOCore
import NIOPosix
import RPCTLS
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A small HTTP/1.1 client for one thing: `GET /metrics` from a process of the cluster, over
/// cleartext or, when the cluster's ports speak TLS (`PEER_TLS_*`), over TLS with ALPN
/// `http/1.1` and the gateway's client certificate, on one event loop, within a deadline that covers everything (connecting, sending,
/// the whole answer) and with a bound on the answer's size. One connection per request
/// (`Connection: close`); the answer is read as `Content-Length`, chunked, or up to the close.
/// Only status 200 is a success. Failures say what happened without naming the address (they are
/// shown on a public page).
enum MetricsFetch {
    enum Failure: Error, Equatable, CustomStringConvertible {
        case connect(String)
        case timeout
        case tooLarge(Int)
        case status(Int)
        case malformed(String)
        case closed
        case cancelled
        /// The TLS handshake failed: its kind for the public page, the full reason for the log.
        case tls(String, detail: String)

        /// What the gateway's log says: the description, with a TLS failure's full reason.
        var detail: String {
            if case .tls(_, let detail) = self { return detail }
            return description
        }

        var description: String {
            switch self {
            case .connect(let why): "cannot connect (\(why))"
            case .timeout: "no answer in time"
            case .tooLarge(let limit): "answer larger than \(limit) bytes"
            case .status(let code): "answered HTTP \(code)"
            case .malformed(let why): "malformed answer (\(why))"
            case .closed: "connection closed before the answer ended"
            case .cancelled: "cancelled"
            case .tls(let kind, _): "TLS: \(kind)"
            }
        }
    }

    /// The largest response head read.
    static let maxHeadBytes = 16 * 1024

    /// `GET path` from `host:port`; the body of a 200 answer.
    static func get(
        host: String, port: Int, path: String = "/metrics", timeout: Duration, maxBytes: Int = 4 * 1024 * 1024,
        tls: TLSConfiguration? = nil, serverName: String? = nil,
        on loop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next()
    ) async throws -> [UInt8] {
        let request = Array(
            "GET \(path) HTTP/1.1\r\nHost: \(host.contains(":") ? "[\(host)]" : host):\(port)\r\nAccept: text/plain\r\nUser-Agent: gateway-status\r\nConnection: close\r\n\r\n"
                .utf8)
        let exchange = Exchange(promise: loop.makePromise(of: [UInt8].self))
        let deadline = loop.scheduleTask(in: TimeAmount(timeout)) { exchange.finish(.failure(Failure.timeout)) }
        exchange.promise.futureResult.whenComplete { _ in deadline.cancel() }
        ClientBootstrap(group: loop)
            .connectTimeout(TimeAmount(timeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        // Writes wait in the TLS handler until its handshake is done.
                        try channel.pipeline.syncOperations.addHandler(OpenSSLHandler(configuration: tls, serverName: serverName ?? host))
                    }
                    try channel.pipeline.syncOperations.addHandler(Handler(exchange: exchange, request: request, maxBody: maxBytes))
                }
            }
            .connect(host: host, port: port)
            .whenComplete { result in
                switch result {
                case .success(let channel): exchange.attach(channel)
                case .failure(let error): exchange.finish(.failure(Self.connectFailure(error)))
                }
            }
        return try await withTaskCancellationHandler {
            try await exchange.promise.futureResult.get()
        } onCancel: {
            exchange.finish(.failure(Failure.cancelled))
        }
    }

    /// A TLS failure's kind in a few words (shown on the public page).
    static func describe(_ kind: TLSError.Kind) -> String {
        switch kind {
        case .certificateVerificationFailed: "the service's certificate is not trusted"
        case .certificateRejectedByPeer: "the service refused the gateway's certificate"
        case .handshakeTimeout: "handshake timed out"
        case .closedDuringHandshake: "closed during the handshake"
        case .configuration, .handshakeFailed, .protocolError: "handshake failed"
        }
    }

    static func connectFailure(_ error: any Error) -> Failure {
        if let e = error as? ChannelError, case .connectTimeout = e { return .timeout }
        if let e = error as? IOError {
            switch e.errnoCode {
            case ECONNREFUSED: return .connect("refused")
            case EHOSTUNREACH, ENETUNREACH: return .connect("unreachable")
            default: return .connect("error \(e.errnoCode)")
            }
        }
        if error is NIOConnectionError { return .connect("refused") }
        return .connect("\(type(of: error))")
    }

    /// One request's result, completed once (the answer, the deadline, a failure or
    /// cancellation, whichever comes first); the connection is closed then.
    final class Exchange: Sendable {
        let promise: EventLoopPromise<[UInt8]>
        private struct State {
            var done = false
            var channel: (any Channel)?
        }
        private let state = Mutex(State())

        init(promise: EventLoopPromise<[UInt8]>) { self.promise = promise }

        func attach(_ channel: any Channel) {
            let done = state.withLock { s in
                s.channel = channel
                return s.done
            }
            if done { channel.close(promise: nil) }
        }

        func finish(_ result: Result<[UInt8], any Error>) {
            let (first, channel): (Bool, (any Channel)?) = state.withLock { s in
                defer { s.done = true }
                return (!s.done, s.channel)
            }
            guard first else { return }
            channel?.close(promise: nil)
            promise.completeWith(result)
        }
    }

    /// Sends the request when connected; collects the answer until it is complete.
    final class Handler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        let exchange: Exchange
        let request: [UInt8]
        let maxBody: Int
        var received: [UInt8] = []
        var reader: HTTPResponseReader

        init(exchange: Exchange, request: [UInt8], maxBody: Int) {
            self.exchange = exchange
            self.request = request
            self.maxBody = maxBody
            reader = HTTPResponseReader(maxBody: maxBody)
        }

        func channelActive(context: ChannelHandlerContext) {
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: request)), promise: nil)
            context.fireChannelActive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            received.append(contentsOf: buffer.readableBytesView)
            check(ended: false)
        }

        func channelInactive(context: ChannelHandlerContext) {
            check(ended: true)
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            // A TLS refusal says which (certificate rejected, not trusted, …), not "closed".
            if let tls = error as? TLSError {
                exchange.finish(.failure(Failure.tls(MetricsFetch.describe(tls.kind), detail: tls.description)))
            } else {
                exchange.finish(.failure(Failure.closed))
            }
            context.close(promise: nil)
        }

        private func check(ended: Bool) {
            switch reader.read(received, ended: ended) {
            case .incomplete: if ended { exchange.finish(.failure(Failure.closed)) }
            case .complete(let body): exchange.finish(.success(body))
            case .failed(let failure): exchange.finish(.failure(failure))
            }
        }
    }
}

/// Reads an HTTP/1.1 response from the bytes received so far (called again as more arrive):
/// the status line and headers once, then the body by `Content-Length`, chunked transfer coding,
/// or up to the connection's end. Bodies over `maxBody` fail as soon as that is known.
struct HTTPResponseReader {
    enum Outcome: Equatable {
        case incomplete
        case complete([UInt8])
        case failed(MetricsFetch.Failure)
    }

    struct Head {
        var status: Int
        var bodyStart: Int
        var length: Int?
        var chunked: Bool
    }

    let maxHead: Int
    let maxBody: Int
    private(set) var head: Head?

    init(maxHead: Int = MetricsFetch.maxHeadBytes, maxBody: Int) {
        self.maxHead = maxHead
        self.maxBody = maxBody
    }

    /// `bytes`: everything received so far; `ended`: the connection has closed.
    mutating func read(_ bytes: [UInt8], ended: Bool) -> Outcome {
        if head == nil {
            switch Self.head(bytes, maxHead: maxHead) {
            case .success(nil): return ended ? .failed(.closed) : .incomplete
            case .success(let h?): head = h
            case .failure(let f): return .failed(f)
            }
        }
        guard let head else { return .incomplete }
        // Informational answers (100 Continue) are not expected: a GET sends no body.
        guard head.status == 200 else { return .failed(.status(head.status)) }
        let body = bytes[head.bodyStart...]
        if head.chunked {
            // Chunk framing adds a few bytes per chunk: the bound is checked on the data in `dechunk`.
            if body.count > maxBody + maxBody / 8 + 4096 { return .failed(.tooLarge(maxBody)) }
            // A chunked body ends with the last chunk and an empty line: try only then.
            guard ended || body.suffix(4).elementsEqual([13, 10, 13, 10]) else { return .incomplete }
            let outcome = Self.dechunk(body, maxBody: maxBody)
            return outcome == .incomplete && ended ? .failed(.closed) : outcome
        }
        if let length = head.length {
            if length > maxBody { return .failed(.tooLarge(maxBody)) }
            if body.count >= length { return .complete(Array(body.prefix(length))) }
            return ended ? .failed(.closed) : .incomplete
        }
        if body.count > maxBody { return .failed(.tooLarge(maxBody)) }
        return ended ? .complete(Array(body)) : .incomplete
    }

    /// The status line and headers; nil until the empty line that ends them has arrived.
    static func head(_ bytes: [UInt8], maxHead: Int) -> Result<Head?, MetricsFetch.Failure> {
        guard let headEnd = find([13, 10, 13, 10], in: bytes[...], from: 0, limit: maxHead + 4) else {
            return bytes.count > maxHead + 4 ? .failure(.malformed("head too large")) : .success(nil)
        }
        let text = String(decoding: bytes[..<headEnd], as: UTF8.self)
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
        let statusLine = lines.removeFirst().split(separator: " ", maxSplits: 2)
        guard statusLine.count >= 2, statusLine[0].hasPrefix("HTTP/1."), statusLine[1].utf8.count == 3, let status = Int(statusLine[1]) else {
            return .failure(.malformed("not an HTTP/1.1 status line"))
        }
        var h = Head(status: status, bodyStart: headEnd + 4, length: nil, chunked: false)
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { return .failure(.malformed("header without a colon")) }
            let name = line[..<colon].lowercased()
            let value = trim(line[line.index(after: colon)...])
            if name == "content-length" {
                guard let n = Int(value), n >= 0, h.length == nil || h.length == n else { return .failure(.malformed("bad content-length")) }
                h.length = n
            } else if name == "transfer-encoding" {
                h.chunked = value.lowercased().split(separator: ",").last.map { trim($0) } == "chunked"
            }
        }
        return .success(h)
    }

    /// A chunked body: complete at the last (zero-size) chunk; trailers are not needed.
    static func dechunk(_ bytes: ArraySlice<UInt8>, maxBody: Int) -> Outcome {
        var out: [UInt8] = []
        var i = bytes.startIndex
        while true {
            guard let lineEnd = find([13, 10], in: bytes, from: i, limit: 1024) else {
                return bytes.endIndex - i > 1024 ? .failed(.malformed("bad chunk size")) : .incomplete
            }
            let sizeText = String(decoding: bytes[i..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
            guard let size = Int(trim(sizeText), radix: 16), size >= 0 else { return .failed(.malformed("bad chunk size")) }
            if size == 0 { return .complete(out) }
            if out.count + size > maxBody { return .failed(.tooLarge(maxBody)) }
            let dataStart = lineEnd + 2
            guard bytes.endIndex - dataStart >= size + 2 else { return .incomplete }
            out.append(contentsOf: bytes[dataStart..<(dataStart + size)])
            guard bytes[dataStart + size] == 13, bytes[dataStart + size + 1] == 10 else { return .failed(.malformed("bad chunk end")) }
            i = dataStart + size + 2
        }
    }

    /// Where `needle` starts in `bytes`, at or after `from`, looking at no more than `limit` bytes.
    static func find(_ needle: [UInt8], in bytes: ArraySlice<UInt8>, from: Int, limit: Int) -> Int? {
        let last = min(bytes.endIndex, from + limit) - needle.count
        guard from <= last else { return nil }
        var i = from
        while i <= last {
            if bytes[i] == needle[0] && bytes[i..<(i + needle.count)].elementsEqual(needle) { return i }
            i += 1
        }
        return nil
    }

    static func trim(_ s: Substring) -> String {
        var t = s
        while let c = t.first, c == " " || c == "\t" { t.removeFirst() }
        while let c = t.last, c == " " || c == "\t" { t.removeLast() }
        return String(t)
    }
}
