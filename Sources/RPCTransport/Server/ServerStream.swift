import NIOCore
import RPCCore

/// One request stream's state. Owned by its `ServerConnectionHandler` and touched only on the
/// connection's event loop; the exceptions are a forwarding handler's answers (`respond`, and
/// `sendHeaders`, `forward`, `whenWritable`, `end`), which may come from any thread: off the loop
/// they only read what was set before the handler ran and hop to the loop.
final class ServerStream: UnaryResponder, RelayResponder, ResponseForwarder, @unchecked Sendable {
    enum Phase { case receivingHeaders, receiving, running, done }

    let id: Int32
    var phase: Phase = .receivingHeaders

    // Request headers as they arrive.
    var method = ""
    var path = ""
    /// `content-type: application/grpc[+proto|...]`; `contentType` is kept only when not.
    var isGRPCContentType = false
    var authority = ""
    var timeout: String?
    /// When the call's `grpc-timeout` runs out, counted from the request headers.
    var deadline: ContinuousClock.Instant?
    var encoding: String?
    var metadata = Metadata()
    /// A relayed call's metadata, as its header block carried it (`RawHandler.unaryRelay`:
    /// `metadata` stays empty).
    var relayMetadata = MetadataBytes()
    var headerListSize = 0
    var headersTooLarge = false
    var badMetadata: String?
    /// Plain HTTP (not gRPC) request for the configured `HTTPHandler`: headers and body kept whole
    /// (`HTTPPart`).
    var isHTTP = false

    // Request messages.
    var deframer: MessageDeframer
    var target: ServerMethod?
    /// The target's requests stream (client or bidirectional streaming), kept apart so the data
    /// path does not copy `target`.
    var clientStreams = false
    var single: RawMessageStream.InboundMessage?
    var inputClosed = false
    /// Request bytes received but not yet released to flow control (`nghttp2_session_consume`):
    /// a completed message's until its handler takes it (unary: when it starts; streaming: as it
    /// reads each message). Returned to the connection when the stream ends.
    var heldBytes = 0
    /// Budget bytes (connection and process) charged for this stream's large messages: the one
    /// arriving, once admitted, and completed ones not handed over yet. Released on hand-over or
    /// when the stream ends.
    var charged = 0
    /// Its large message waits for room in the connection's budget (`ConnectionRequestBudget`);
    /// meanwhile its window (what it may hold unconsumed) is charged to the process budget.
    var awaitingAdmission = false
    var waitCharged = 0

    // The call.
    /// When the call's headers were accepted, while a `ServerCallObserver` waits for its end.
    /// (`NIODeadline.now().uptimeNanoseconds`, one vDSO `clock_gettime`; 0: not observed, or
    /// already reported.)
    var startedAt: UInt64 = 0
    var requestMessages = 0
    var requestBytes = 0
    var responseMessages = 0
    var responseBytes = 0
    var context: ServerContext?
    /// A relayed call's response headers and trailers (`RawHandler.unaryRelay`: no context).
    var relayedHeaders = Metadata()
    var relayedTrailers = Metadata()
    var task: Task<Void, Never>?
    /// What stops a forwarding handler (`unaryForwarding`, `serverStreamingForwarding`, the
    /// HTTP path's task-free answers), which runs without a task of its own.
    var cancellation: (any Cancellable)?
    /// A forwarding handler's answer goes back to this connection, on its loop (set before the
    /// handler runs, read-only afterwards).
    var owner: StreamOwner?
    var deadlineTimer: Scheduled<Void>?
    /// `grpc-accept-encoding` lists gzip.
    var clientAcceptsGzip = false
    /// The response headers declared `grpc-encoding: gzip` (responses may be compressed).
    var responseGzip = false

    // Response.
    var headersSent = false
    var outbound = OutboundBytes()
    var dataDeferred = false
    var trailers: HeaderBlock?

    // What only some streams use, in parts made for them alone: a gRPC unary call's stream, the
    // usual one, then has fewer fields to set up and release (every call's cost, in every
    // process).

    /// What a plain HTTP request keeps (`isHTTP`), and the content type of a request that is not
    /// gRPC.
    final class HTTPPart {
        var contentType = ""
        var rawHeaders = HeaderBlock(capacity: 0)
        /// `rawHeaders` as pairs, made once when the head is complete (for the handler's
        /// head-time checks and then its request).
        var headerPairs: [(name: String, value: String)]?
        var body: [UInt8] = []
        var complete = false
        /// The body limit (from the handler's `maxBodyBytes`, else the server's) and the bytes
        /// of the body charged to the process budget (those past `initialWindowSize`).
        var limit = 0
        var charged = 0
    }
    private(set) var httpPart: HTTPPart?
    var http: HTTPPart { Self.made(&httpPart, HTTPPart.init) }

    /// What streaming requests and responses keep: the request stream a client- or
    /// bidirectional-streaming handler reads, the charges of its queued messages, and those
    /// waiting for room to write.
    final class StreamingPart {
        var requestStream: RawMessageStream?
        /// Charges of queued messages by their position (only charged ones), and how many were
        /// yielded and read, so each read releases its own message's charge.
        var unreadCharges: [Int: Int] = [:]
        var messagesYielded = 0
        var messagesRead = 0
        var writeWaiters: [CheckedContinuation<Void, any Error>] = []
        /// A forwarding handler's `whenWritable` callbacks, run as `writeWaiters` are resumed.
        var writableCallbacks: [@Sendable () -> Void] = []
    }
    private(set) var streamingPart: StreamingPart?
    var streaming: StreamingPart { Self.made(&streamingPart, StreamingPart.init) }

    /// The part in `slot`, made there the first time.
    @inline(__always)
    private static func made<Part: AnyObject>(_ slot: inout Part?, _ make: () -> Part) -> Part {
        if let part = slot { return part }
        let part = make()
        slot = part
        return part
    }

    // The parts' fields as the stream's own (reading one of a part not made reads its default).
    var contentType: String {
        get { httpPart?.contentType ?? "" }
        set { http.contentType = newValue }
    }
    var rawHeaders: HeaderBlock {
        get { httpPart?.rawHeaders ?? HeaderBlock(capacity: 0) }
        _modify { yield &http.rawHeaders }
    }
    var httpHeaderPairs: [(name: String, value: String)]? {
        get { httpPart?.headerPairs }
        set { http.headerPairs = newValue }
    }
    var httpBody: [UInt8] {
        get { httpPart?.body ?? [] }
        _modify { yield &http.body }
    }
    var httpComplete: Bool {
        get { httpPart?.complete ?? false }
        set { http.complete = newValue }
    }
    var httpLimit: Int {
        get { httpPart?.limit ?? 0 }
        set { http.limit = newValue }
    }
    var httpCharged: Int {
        get { httpPart?.charged ?? 0 }
        set { http.charged = newValue }
    }
    var requestStream: RawMessageStream? {
        get { streamingPart?.requestStream }
        set { streaming.requestStream = newValue }
    }
    var unreadCharges: [Int: Int] {
        get { streamingPart?.unreadCharges ?? [:] }
        _modify { yield &streaming.unreadCharges }
    }
    var messagesYielded: Int {
        get { streamingPart?.messagesYielded ?? 0 }
        set { streaming.messagesYielded = newValue }
    }
    var messagesRead: Int {
        get { streamingPart?.messagesRead ?? 0 }
        set { streaming.messagesRead = newValue }
    }
    var writeWaiters: [CheckedContinuation<Void, any Error>] {
        get { streamingPart?.writeWaiters ?? [] }
        _modify { yield &streaming.writeWaiters }
    }
    var writableCallbacks: [@Sendable () -> Void] {
        get { streamingPart?.writableCallbacks ?? [] }
        _modify { yield &streaming.writableCallbacks }
    }

    /// The writers waiting for room, taken (none, and no part made, on a stream that had none).
    func takeWriters() -> (waiters: [CheckedContinuation<Void, any Error>], callbacks: [@Sendable () -> Void]) {
        guard let part = streamingPart, !part.writeWaiters.isEmpty || !part.writableCallbacks.isEmpty else { return ([], []) }
        defer {
            part.writeWaiters = []
            part.writableCallbacks = []
        }
        return (part.writeWaiters, part.writableCallbacks)
    }

    /// The call ended early (cancelled, deadline, connection gone): stop its handler.
    func cancelHandler() {
        task?.cancel()
        cancellation?.cancel()
    }

    init(id: Int32, maxMessageSize: Int) {
        self.id = id
        self.deframer = MessageDeframer(maxMessageSize: maxMessageSize)
    }

    /// A `unaryForwarding` handler's answer: completes the call on its connection's loop.
    func respond(_ result: Result<[UInt8], any Error>) {
        guard let owner else { return }
        if owner.loop.inEventLoop {
            owner.handler.value.complete(id, response: result)
        } else {
            let id = self.id
            owner.loop.execute { owner.handler.value.complete(id, response: result) }
        }
    }

    /// A `unaryRelay`'s answer: completes the call on its connection's loop.
    func respond(_ result: Result<[UInt8], any Error>, headers: Metadata, trailers: Metadata) {
        guard let owner else { return }
        if owner.loop.inEventLoop {
            owner.handler.value.completeRelayed(id, result, headers: headers, trailers: trailers)
        } else {
            let id = self.id
            owner.loop.execute { owner.handler.value.completeRelayed(id, result, headers: headers, trailers: trailers) }
        }
    }

    // MARK: ResponseForwarder (a `serverStreamingForwarding` handler's responses)

    /// Runs `body` with the connection on its loop: now when called there, else hopping.
    private func onLoop(_ body: @escaping @Sendable (ServerConnectionHandler) -> Void) {
        guard let owner else { return }
        if owner.loop.inEventLoop { body(owner.handler.value) } else { owner.loop.execute { body(owner.handler.value) } }
    }

    func sendHeaders() {
        onLoop { h in h.forwardHeaders(self) }
    }

    func forward(_ message: [UInt8]) -> Bool {
        guard let owner else { return true }
        if owner.loop.inEventLoop { return owner.handler.value.forward(self, message) }
        owner.loop.execute { _ = owner.handler.value.forward(self, message) }
        return true
    }

    func whenWritable(_ body: @escaping @Sendable () -> Void) {
        onLoop { h in h.whenWritable(self, body) }
    }

    func end(_ result: Result<Void, any Error>) {
        let id = self.id
        onLoop { h in h.complete(id, response: result.map { [] }, streaming: true) }
    }
}
