/// A plain HTTP request that is not gRPC (Connect JSON, a web page), handed whole to an
/// `HTTPHandler`. The gateway serves these on the same port as gRPC, over HTTP/1.1 and HTTP/2.
public struct HTTPRequest: Sendable {
    public var method: String
    /// Path and query, as sent (`/accounts.v1.Accounts/LogIn?x=1`).
    public var target: String
    /// Header names lower-cased, in order (pseudo-headers excluded).
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    public var peer: String

    public init(method: String, target: String, headers: [(name: String, value: String)], body: [UInt8], peer: String) {
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.peer = peer
    }

    public var path: Substring { Self.path(of: target) }
    /// The path part of a request target (before any `?`). Byte-wise: this runs for every request.
    public static func path(of target: String) -> Substring {
        guard let q = target.utf8.firstIndex(of: UInt8(ascii: "?")) else { return target[...] }
        return target[..<q]
    }
    /// The first value of a header; `name` as the headers are kept, lower-case (an upper-case
    /// name is lowered first).
    public func header(_ name: String) -> String? {
        if name.utf8.contains(where: { $0 >= 65 && $0 <= 90 }) {
            let n = name.lowercased()
            return headers.first { $0.name == n }?.value
        }
        return headers.first { $0.name == name }?.value
    }
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// A body produced after the head has gone out (a stream: gRPC-Web, Connect streaming).
    /// When set, `body` is ignored and the response has no `content-length`: HTTP/1.1 sends it
    /// chunked (HTTP/1.0: until the connection closes), HTTP/2 as DATA frames as they are
    /// written; the response ends when the closure returns or throws. It runs in the request's
    /// task, which is cancelled when the client goes away (HTTP/2 RST_STREAM, the connection
    /// closed, the server shutting down), so whatever it started ends with the client.
    public var stream: (@Sendable (any HTTPBodyWriter) async throws -> Void)?

    public init(
        status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
        stream: (@Sendable (any HTTPBodyWriter) async throws -> Void)? = nil
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
    }
}

/// Where a streamed response body goes (`HTTPResponse.stream`).
public protocol HTTPBodyWriter: Sendable {
    /// Sends `bytes` to the client (flushed: a stream's messages are not held back). Suspends
    /// while the client is slower than the writer (the server's response buffer is full), and
    /// throws once the client has gone or the response can no longer be written.
    func write(_ bytes: [UInt8]) async throws
}

/// Serves non-gRPC requests. Without one, a server answers them 415 with a gRPC error.
public protocol HTTPHandler: Sendable {
    func handle(_ request: HTTPRequest) async -> HTTPResponse
    /// The largest body the server should read for a request, asked when its head arrives: a
    /// declared `content-length` above it is answered 413 at once (and the body never read), a
    /// body growing past it is cut off with 413. nil: the server's own limit. Called on the event
    /// loop: quick, non-blocking.
    func maxBodyBytes(method: String, path: Substring) -> Int?
    /// Answers without a task of its own when it can, as `RawHandler.unaryForwarding` does for
    /// gRPC: called on the connection's event loop once the request has been read. Returns false
    /// when only `handle` can answer (the server then runs it in a task). When it returns true it
    /// calls `respond` exactly once, from any thread, with a response that has no `stream`, and
    /// registers whatever it started on `cancellation`, which the server cancels when the client
    /// goes first. Must be quick and must not block. Default: false.
    func handleImmediately(
        _ request: HTTPRequest, cancellation: CallCancellation, respond: @escaping @Sendable (HTTPResponse) -> Void
    ) -> Bool
    /// Asked when a request's head has arrived, before any of its body is read (`request.body`
    /// is empty): a response to send at once — the body is then discarded unread and, over
    /// HTTP/1.1, the connection closes after it — or nil to read the body and go on. For
    /// refusals that need only the head (a method that cannot be served this way, a missing
    /// credential). Called on the event loop: quick, non-blocking. Default: nil.
    func respondAtHead(_ request: HTTPRequest) -> HTTPResponse?
    /// The answer to a body over the request's limit (`maxBodyBytes`), declared or growing
    /// (`request.body` is empty). Default: a plain 413.
    func bodyTooLarge(_ request: HTTPRequest, limit: Int) -> HTTPResponse
}

extension HTTPHandler {
    public func maxBodyBytes(method: String, path: Substring) -> Int? { nil }
    public func handleImmediately(
        _ request: HTTPRequest, cancellation: CallCancellation, respond: @escaping @Sendable (HTTPResponse) -> Void
    ) -> Bool { false }
    public func respondAtHead(_ request: HTTPRequest) -> HTTPResponse? { nil }
    public func bodyTooLarge(_ request: HTTPRequest, limit: Int) -> HTTPResponse { .bodyTooLarge(limit: limit) }
}

extension HTTPResponse {
    /// 413 for a plain-HTTP request body over the request's limit (HTTP/1.1 and HTTP/2).
    public static func bodyTooLarge(limit: Int) -> HTTPResponse {
        HTTPResponse(status: 413, headers: [("content-type", "text/plain")], body: Array("request body exceeds \(limit) bytes\n".utf8))
    }
}
