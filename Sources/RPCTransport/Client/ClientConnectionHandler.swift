import CNGHTTP2
import CNGHTTP2Memory
import NIOCore
import RPCCore
import RPCTLS

/// One call's state inside a client connection; touched only on the connection's event loop.
/// A call reports what happens to it through the methods below (on the loop). A `TasklessCall`
/// is its own stream state and overrides them (one object per relayed call, not two); a
/// `ClientCall` (an async call, used from tasks) is reported to through `ObservedStream`. Public
/// only as `TasklessCall`'s superclass: nothing of it is visible outside the transport.
open class ClientStreamState {
    var id: Int32 = -1
    var outbound = OutboundBytes()
    var sendClosed = false
    /// The request headers said `grpc-encoding: gzip`; only then may a message be compressed.
    var mayCompress = false
    var dataDeferred = false
    /// Bytes of delivered-but-unread response messages still holding the flow-control window;
    /// returned to the connection when the stream closes, whatever the reader does later.
    var heldBytes = 0
    /// Bytes of the message still arriving, held back because the reader was behind (see
    /// `onDataChunk`); counted into that message's bytes once it completes.
    var heldPartial = 0
    var sendWaiters: [CheckedContinuation<Void, any Error>] = []

    var responseStatus = 0
    /// `content-type: application/grpc...`; `contentType` is kept only when not.
    var isGRPCContentType = false
    var contentType = ""
    var encoding: String?
    var headers = Metadata()
    var grpcStatus: Int?
    /// Whether the status the call ends with is the peer's own (its `grpc-status` arrived),
    /// not one the transport made (`RawClientCall.statusCameFromPeer`).
    public var statusCameFromPeer: Bool { grpcStatus != nil }
    var grpcMessage = ""
    var statusDetails: [UInt8]?
    var headersReceived = false
    var deframer: MessageDeframer
    /// When the call ends on its own if still running (its `timeout`, or its `limit`), and how.
    var expiresAt: NIODeadline?
    var expiry: Expiry = .timeout(.zero)
    enum Expiry {
        case timeout(Duration)
        case limit(String)
    }

    /// The connection sets the deframer's limit when the stream starts (`start`).
    init() {
        self.deframer = MessageDeframer(maxMessageSize: 0)
    }

    // What the call is told, on the connection's loop; the two kinds of call override all six.
    /// The call ended (the connection then sends nothing more for it).
    var isFinished: Bool { preconditionFailure("a stream state's call overrides isFinished") }
    /// The stream exists; false when the call was cancelled before it started (the connection
    /// then resets the stream).
    func attach(to connection: ClientConnectionLink, streamID: Int32) -> Bool { preconditionFailure("overridden") }
    func headersArrived(_ metadata: Metadata) { preconditionFailure("overridden") }
    /// A response message. True when it was used up at once, so the connection can give its
    /// bytes back to the flow-control window now; false when a reader will (`consumed`).
    func received(_ message: RawMessageStream.InboundMessage) -> Bool { preconditionFailure("overridden") }
    func finish(status: RPCStatus, trailers: Metadata, headers: Metadata?) { preconditionFailure("overridden") }
    func fail(_ status: RPCStatus) { preconditionFailure("overridden") }
}

/// The stream state of a call that is not its own (an async `ClientCall`): passes everything on
/// to it.
final class ObservedStream: ClientStreamState {
    let call: ClientCall
    init(_ call: ClientCall) {
        self.call = call
        super.init()
    }
    override var isFinished: Bool { call.isFinished }
    override func attach(to connection: ClientConnectionLink, streamID: Int32) -> Bool { call.attach(to: connection, streamID: streamID) }
    override func headersArrived(_ metadata: Metadata) { call.headersArrived(metadata) }
    override func received(_ message: RawMessageStream.InboundMessage) -> Bool { call.received(message) }
    override func finish(status: RPCStatus, trailers: Metadata, headers: Metadata?) {
        call.finish(status: status, trailers: trailers, headers: headers, fromPeer: statusCameFromPeer)
    }
    override func fail(_ status: RPCStatus) { call.fail(status) }
}

/// Client side of one HTTP/2 connection, driven like the server side: nghttp2 client session,
/// bytes in/out through the channel, many concurrent calls multiplexed as streams.
final class ClientConnectionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let configuration: ChannelConfiguration
    private(set) var session: OpaquePointer?
    var streams = StreamTable<ClientStreamState>()
    private var context: ChannelHandlerContext?
    private var flushScheduled = false
    private var inCallback = false
    private(set) var isUsable = true
    private var closed = false
    /// Why the connection ended, for calls that arrive after it did.
    private var closeReason: RPCError?
    /// Why the connection ended, once it has (read on the event loop).
    var closedReason: RPCError? { closed ? closeReason : nil }
    let onClose: @Sendable () -> Void
    /// Completed when calls may start: at connect for h2c; for TLS, once the handshake finished
    /// *and* the server's first bytes (its SETTINGS) decrypted. A TLS 1.3 client's handshake ends
    /// before the server has checked the client's certificate: a server requiring one (mutual
    /// TLS) that refuses it answers with an alert instead of SETTINGS. Waiting for the server to
    /// speak turns that refusal into a failed connect (the reason reaches every waiting call,
    /// and the channel's reconnect backoff applies) instead of a connection that dies under
    /// its first calls. Failed with the reason when the connection dies first.
    let ready: EventLoopPromise<Void>
    private var handshakeDone = false
    /// Bounds the wait for the server's first bytes after the handshake (`connectTimeout`): a
    /// TLS server that never speaks HTTP/2 fails the connect instead of holding it.
    private var firstBytesTimeout: Scheduled<Void>?

    init(configuration: ChannelConfiguration, ready: EventLoopPromise<Void>, onClose: @escaping @Sendable () -> Void) {
        self.configuration = configuration
        self.ready = ready
        self.onClose = onClose
    }

    /// The output buffer reused across flushes (see `drainSessionOutput`).
    private var outputScratch: ByteBuffer?
    /// Keepalive (`ChannelConfiguration.keepaliveTime`): reads so far (wraps) and at the last tick.
    private var reads = 0
    private var readsAtTick = 0
    private var keepaliveTimer: RepeatedTask?
    private var pingTimeout: Scheduled<Void>?
    /// The timer for the earliest call deadline, and when it fires (see `expire`).
    private var expiryTimer: Scheduled<Void>?
    private var expiryAt = NIODeadline.distantFuture
    /// Storage for each call's request header block, reused (see `start`).
    private var requestBlock = HeaderBlock()
    /// The request headers every call on this connection sends, built once, the channel's own
    /// metadata (`ChannelConfiguration.metadata`) among them: a call sends its `:path` before
    /// them and its own headers after them (`HeaderBlock.withRequestNV`).
    private lazy var requestHeaders: HeaderBlock = {
        var block = HeaderBlock()
        block.add(":method", "POST")
        block.add(":scheme", configuration.tls == nil ? "http" : "https")
        block.add(":authority", configuration.authority)
        block.add("content-type", "application/grpc")
        block.add("te", "trailers")
        block.add("user-agent", "backend-swift-grpc/1.0")
        block.add("grpc-accept-encoding", "gzip,identity")
        block.add(metadata: configuration.metadata)
        return block
    }()

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, clientOnHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, clientOnFrameRecv)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, clientOnDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, clientOnStreamClose)
        var option: OpaquePointer?
        nghttp2_option_new(&option)
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_no_auto_window_update(option, 1)
        var s: OpaquePointer?
        // nghttp2 allocates through per-thread free lists (CNGHTTP2Memory): a dozen blocks a call.
        nghttp2_session_client_new3(&s, callbacks, Unmanaged.passUnretained(self).toOpaque(), option, rpc_nghttp2_memory())
        session = s
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            // RFC 9218: no RFC 7540 priority tree, and no closed streams kept for it.
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: HTTP2Setting.window(configuration.initialWindowSize)),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: HTTP2Setting.value(configuration.maxHeaderListSize)),
        ]
        nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        nghttp2_session_set_local_window_size(
            s, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, HTTP2Setting.connectionWindow(streamWindow: configuration.initialWindowSize))
        if let every = configuration.keepaliveTime {
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            keepaliveTimer = context.eventLoop.scheduleRepeatedTask(initialDelay: TimeAmount(every), delay: TimeAmount(every)) { _ in
                bound.value.keepaliveTick()
            }
        }
        if context.channel.isActive { flush() }
    }

    /// Nothing read for a whole `keepaliveTime` (and a call open, unless `keepaliveWithoutCalls`):
    /// PING; nothing read within `keepaliveTimeout` after it ends the connection.
    private func keepaliveTick() {
        guard session != nil, context != nil, pingTimeout == nil else { return }
        if reads != readsAtTick {
            readsAtTick = reads
            return
        }
        guard configuration.keepaliveWithoutCalls || !streams.isEmpty else { return }
        ping(timeout: configuration.keepaliveTimeout, what: "a keepalive PING")
    }

    /// A PING now, whatever was read lately: nothing read within `timeout` ends the connection
    /// (its calls fail with UNAVAILABLE). What a caller asks for when it has reason to think the
    /// peer is gone (`RPCChannel.checkLiveness`: the gateway, after a health check of the
    /// upstream timed out) rather than waiting for `keepaliveTime` of silence. Nothing is sent
    /// while a PING is already out.
    func checkLiveness(timeout: Duration) {
        guard session != nil, context != nil, pingTimeout == nil else { return }
        ping(timeout: timeout, what: "a liveness PING")
    }

    private func ping(timeout: Duration, what: String) {
        guard let session, let context else { return }
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        flush()
        let snapshot = reads
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        pingTimeout = context.eventLoop.scheduleTask(in: TimeAmount(timeout)) {
            let h = bound.value
            h.pingTimeout = nil
            guard h.reads == snapshot else {
                h.readsAtTick = h.reads
                return
            }
            h.teardown(RPCError(.unavailable, "\(h.configuration.target) did not answer \(what) within \(timeout)"))
            h.context?.close(promise: nil)
        }
    }

    func channelActive(context: ChannelHandlerContext) {
        flush()
        if configuration.tls == nil { ready.succeed() }
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let done = event as? TLSHandshakeCompleted {
            // The server chose a protocol other than HTTP/2: say so, rather than fail later on
            // bytes it will not understand. (No ALPN answer at all is accepted.)
            if let chosen = done.negotiatedProtocol, chosen != "h2" {
                let error = RPCError(.unavailable, "\(configuration.target) did not agree to HTTP/2 over TLS (ALPN chose '\(chosen)')")
                teardown(error)
                context.close(promise: nil)
                return
            }
            handshakeDone = true  // ready once the server's first bytes arrive (channelRead)
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            let timeout = configuration.connectTimeout
            firstBytesTimeout = context.eventLoop.scheduleTask(in: TimeAmount(timeout)) {
                let h = bound.value
                guard h.handshakeDone else { return }
                h.teardown(
                    RPCError(.unavailable, "\(h.configuration.target) sent nothing within \(timeout) of the TLS handshake (no HTTP/2 SETTINGS)"))
                h.context?.close(promise: nil)
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        teardown(RPCError(.unavailable, closedMessage))
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        teardown(RPCError(.unavailable, closedMessage))
        context.fireChannelInactive()
    }

    /// A cleartext connection the server closed before saying anything is most often a port that
    /// speaks TLS (ours closes a non-TLS connection without a word): say so.
    private var closedMessage: String {
        if configuration.tls == nil, reads == 0 {
            return
                "connection to \(configuration.target) closed before the server sent anything (a port that requires TLS closes cleartext h2c connections)"
        }
        return "connection to \(configuration.target) closed"
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        teardown(RPCError(.unavailable, "connection to \(configuration.target) failed: \(error)"))
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let session else { return }
        reads &+= 1
        let buffer = unwrapInboundIn(data)
        // The server connections this read answers calls of are flushed when it is done.
        let rv = readFlushes.duringRead {
            buffer.withUnsafeReadableBytes { bytes -> Int in
                inCallback = true
                defer { inCallback = false }
                return nghttp2_session_mem_recv(session, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count)
            }
        }
        if rv < 0 {
            teardown(RPCError(.unavailable, "HTTP/2 protocol error from \(configuration.target): \(String(cString: nghttp2_strerror(Int32(rv))))"))
            context.close(promise: nil)
            return
        }
        if handshakeDone {
            handshakeDone = false
            firstBytesTimeout?.cancel()
            firstBytesTimeout = nil
            ready.succeed()
        }
        flushScheduled = true
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush()
        context.fireChannelReadComplete()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { flush() }
        context.fireChannelWritabilityChanged()
    }

    /// This loop's deferred flushes (`ReadFlushes`), found on first use, on the loop.
    private lazy var readFlushes = ReadFlushes.forThisThread

    private func teardown(_ error: RPCError) {
        guard !closed else { return }
        closed = true
        isUsable = false
        keepaliveTimer?.cancel()
        keepaliveTimer = nil
        pingTimeout?.cancel()
        pingTimeout = nil
        expiryTimer?.cancel()
        expiryTimer = nil
        closeReason = error
        handshakeDone = false
        firstBytesTimeout?.cancel()
        firstBytesTimeout = nil
        ready.fail(error)
        for s in streams.all { finishStream(s, status: RPCStatus(error.code, error.message), trailers: Metadata()) }
        lending.checkNoneLent()
        streams.removeAll()
        connectionLink = nil  // it refers to this connection: no cycle left behind
        if let session { nghttp2_session_del(session) }
        session = nil
        onClose()
    }

    func flush() {
        flushScheduled = false
        guard let context, let session, !inCallback else { return }
        // Most flushes (each read's end, each answer's) find nothing queued: say so without
        // touching the channel or the output buffer.
        if nghttp2_session_want_write(session) == 0 {
            if nghttp2_session_want_read(session) == 0 { context.close(promise: nil) }
            return
        }
        let (error, reuse) = drainSessionOutput(session, into: context, reusing: outputScratch.take())
        if let reuse { outputScratch = reuse }
        if let error {
            teardown(RPCError(.unavailable, "HTTP/2 send error: \(String(cString: nghttp2_strerror(error)))"))
            context.close(promise: nil)
            return
        }
        // The flush may have ended the connection (a write error closes it at once): look again.
        guard let session = self.session else { return }
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            context.close(promise: nil)
        }
    }

    func scheduleFlush() {
        guard !flushScheduled, let context else { return }
        flushScheduled = true
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.execute { bound.value.flush() }
    }

    // MARK: Starting calls

    /// This connection as its calls reach it (`ClientConnectionLink`), made on the first call and
    /// dropped at teardown (it refers to the connection).
    private var connectionLink: ClientConnectionLink?

    private func link(_ context: ChannelHandlerContext) -> ClientConnectionLink { .reuse(&connectionLink, self, on: context.eventLoop) }

    func start(_ state: ClientStreamState, method: MethodDescriptor, options: CallOptions, request: [UInt8]? = nil) {
        guard let session, context != nil, isUsable else {
            state.fail(RPCStatus(.unavailable, closeReason?.message ?? "connection to \(configuration.target) is closing"))
            return
        }
        // Cancelled (and reported) before it reached the connection: send nothing upstream.
        if state.isFinished { return }
        // A `TasklessCall` is started once (it is its stream's state): a second start would fail
        // or end the first's call, so it is only refused (and stops debug builds).
        guard state.id == -1 else {
            assertionFailure("\(method.path): a call started twice")
            return
        }
        state.deframer.maxMessageSize = configuration.maxReceiveMessageSize
        state.mayCompress = options.compressRequests
        if let request {
            // The whole request is known: it leaves with the headers, END_STREAM set.
            state.outbound.writeMessage(request, compress: options.compressRequests)
            state.sendClosed = true
        }
        // The call's own headers go in a block whose storage is the connection's, reused call
        // after call; the path, the connection's fixed headers and clean metadata a relay
        // passes on are lent as they are (nghttp2 copies everything on submit).
        var block = HeaderBlock(capacity: 0)
        swap(&block, &requestBlock)
        if options.compressRequests { block.add("grpc-encoding", "gzip") }
        if let timeout = options.timeout { block.add("grpc-timeout", GRPCTimeout.format(timeout)) }
        block.add(metadata: options.metadata)
        let forwarded = block.lendable(options.forwardedMetadata)
        let added = block.lendable(options.addedMetadata)
        var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: clientReadData)
        let id = block.withRequestNV(path: method.path, fixed: requestHeaders, forwarded, added) { nva, n in
            nghttp2_submit_request(session, nil, nva, n, &provider, nil)
        }
        block.removeAll()
        swap(&block, &requestBlock)
        guard id > 0 else {
            state.fail(RPCStatus(.unavailable, "could not start a stream: \(String(cString: nghttp2_strerror(id)))"))
            return
        }
        state.id = id
        streams[id] = state
        guard state.attach(to: link(context!), streamID: id) else {
            // Cancelled while it was being started.
            cancel(id, status: RPCStatus(.cancelled, "cancelled by the client"))
            return
        }
        if let timeout = options.timeout {
            expire(state, after: TimeAmount(timeout), .timeout(timeout))
        } else if let limit = options.limit {
            expire(state, after: .nanoseconds(limit.nanoseconds), .limit(limit.message))
        }
        // The connection's only call, started by a server connection's read (a relay): written
        // when that read is done, unless the read starts more (`ReadFlushes`). Otherwise one
        // task writes every call the tick starts.
        if streams.count == 1 && !flushScheduled && readFlushes.isReadingRequests {
            flushScheduled = true
            readFlushes.flushAfterRequestsRead(self)
        } else {
            scheduleFlush()
        }
    }

    /// The server connection's read that started this connection's only call is done: write the
    /// call now if it is still the only one, else leave it to a task, with the calls the tick's
    /// other reads start.
    func requestsRead() {
        if streams.count <= 1 {
            flush()
        } else {
            flushScheduled = false
            scheduleFlush()
        }
    }

    // MARK: Operations from ClientCall (on the loop)

    func send(_ id: Int32, _ message: [UInt8], compress: Bool, _ c: CheckedContinuation<Void, any Error>) {
        guard let s = streams[id], !s.sendClosed else {
            return c.resume(throwing: RPCError(.failedPrecondition, "the request stream is closed"))
        }
        s.outbound.writeMessage(message, compress: compress && s.mayCompress)
        resume(s)
        if s.outbound.readableBytes <= configuration.maxBufferedRequestBytes { c.resume() } else { s.sendWaiters.append(c) }
        scheduleFlush()
    }

    func closeSend(_ id: Int32) {
        guard let s = streams[id], !s.sendClosed else { return }
        s.sendClosed = true
        resume(s)
        scheduleFlush()
    }

    func consumed(_ id: Int32, _ bytes: Int) {
        // A closed stream already gave its held bytes back (releaseHeld).
        guard let session, let s = streams[id] else { return }
        var n = min(bytes, s.heldBytes)
        s.heldBytes -= n
        // The reader caught up: the bytes of the message still arriving, held while it was
        // behind, go back now. Waiting for that message's next chunk would wait for ever when
        // they filled the window (nghttp2 reopens it only once half of it is consumed).
        if s.heldBytes == 0 {
            n += s.heldPartial
            s.heldPartial = 0
        }
        if n > 0 { nghttp2_session_consume(session, id, n) }
        scheduleFlush()
    }

    /// Returns a closing stream's unread bytes to the connection window (nghttp2 updates only the
    /// connection-level window for a stream it no longer tracks).
    private func releaseHeld(_ s: ClientStreamState) {
        guard let session, s.heldBytes + s.heldPartial > 0 else { return }
        nghttp2_session_consume(session, s.id, s.heldBytes + s.heldPartial)
        s.heldBytes = 0
        s.heldPartial = 0
    }

    func cancel(_ id: Int32, status: RPCStatus) {
        guard let session, let s = streams[id] else { return }
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, NGHTTP2_CANCEL.rawValue)
        finishStream(s, status: status, trailers: Metadata())
        scheduleFlush()
    }

    private func resume(_ s: ClientStreamState) {
        if s.dataDeferred, let session {
            s.dataDeferred = false
            nghttp2_session_resume_data(session, s.id)
        }
    }

    // MARK: Deadlines

    /// Calls end at their deadline without a timer each: one timer per connection, set for the
    /// earliest deadline of its calls, ends those due and is set again for the next. Calls on a
    /// connection usually share one timeout (or one limit), so a new call's deadline is rarely
    /// the earliest and a call costs a clock read, not a timer.
    private func expire(_ s: ClientStreamState, after d: TimeAmount, _ how: ClientStreamState.Expiry) {
        let at = NIODeadline.now() + d
        s.expiresAt = at
        s.expiry = how
        armExpiry(at)
    }

    private func armExpiry(_ at: NIODeadline) {
        guard at < expiryAt, let context else { return }
        expiryTimer?.cancel()
        expiryAt = at
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        expiryTimer = context.eventLoop.scheduleTask(deadline: at) { bound.value.expireDue() }
    }

    private func expireDue() {
        expiryTimer = nil
        expiryAt = .distantFuture
        let now = NIODeadline.now()
        var next = NIODeadline.distantFuture
        var due: [ClientStreamState] = []
        for s in streams.all {
            guard let at = s.expiresAt else { continue }
            if at <= now { due.append(s) } else if at < next { next = at }
        }
        for s in due {
            let status =
                switch s.expiry {
                case .timeout(let t): RPCStatus(.deadlineExceeded, "deadline exceeded after \(t)")
                case .limit(let message): RPCStatus(.deadlineExceeded, message)
                }
            cancel(s.id, status: status)
        }
        if next != .distantFuture { armExpiry(next) }
    }

    private func finishStream(_ s: ClientStreamState, status: RPCStatus, trailers: Metadata) {
        s.expiresAt = nil
        let waiters = s.sendWaiters
        s.sendWaiters = []
        for w in waiters { w.resume(throwing: RPCError(status.code == .ok ? .cancelled : status.code, status.message)) }
        s.finish(status: status, trailers: trailers, headers: s.headersReceived ? nil : s.headers)
    }

    // MARK: nghttp2 callbacks

    /// `body` with the stream of `id`, unretained (`StreamLending`).
    private let lending = StreamLending()

    @inline(__always)
    private func withStream<R>(_ id: Int32, _ body: (ClientStreamState) -> R) -> R? { lending.with(streams.unretained(id), body) }

    func readData(_ id: Int32, _ buf: UnsafeMutablePointer<UInt8>, _ length: Int, _ flags: UnsafeMutablePointer<UInt32>) -> Int {
        // Not retained: see `withStream`.
        withStream(id) { readData($0, buf, length, flags) } ?? Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }

    private func readData(_ s: ClientStreamState, _ buf: UnsafeMutablePointer<UInt8>, _ length: Int, _ flags: UnsafeMutablePointer<UInt32>) -> Int {
        let n = s.outbound.read(into: buf, max: length)
        if n > 0 {
            if !s.sendWaiters.isEmpty && s.outbound.readableBytes <= configuration.maxBufferedRequestBytes {
                let w = s.sendWaiters
                s.sendWaiters = []
                for c in w { c.resume() }
            }
        }
        if s.outbound.readableBytes == 0 && s.sendClosed {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return n
        }
        if n == 0 {
            s.dataDeferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        return n
    }

    func onHeader(
        _ frame: UnsafePointer<nghttp2_frame>, _ name: UnsafePointer<UInt8>, _ nameLen: Int,
        _ value: UnsafePointer<UInt8>, _ valueLen: Int
    ) -> Int32 {
        // Not retained (several headers per call): see `withStream`.
        withStream(frame.pointee.hd.stream_id) { onHeader($0, name, nameLen, value, valueLen) } ?? 0
    }

    private func onHeader(
        _ s: ClientStreamState, _ name: UnsafePointer<UInt8>, _ nameLen: Int, _ value: UnsafePointer<UInt8>, _ valueLen: Int
    ) -> Int32 {
        let nameBytes = UnsafeRawBufferPointer(start: name, count: nameLen)
        let valueBytes = UnsafeRawBufferPointer(start: value, count: valueLen)
        switch HeaderName.classify(nameBytes) {
        case .status: s.responseStatus = HeaderName.decimal(valueBytes) ?? 0
        case .contentType:
            s.isGRPCContentType = HeaderName.isGRPCContentType(valueBytes)
            if !s.isGRPCContentType { s.contentType = String(nghttp2: value, count: valueLen) }
        case .grpcEncoding: s.encoding = String(nghttp2: value, count: valueLen)
        case .grpcStatus: s.grpcStatus = HeaderName.decimal(valueBytes) ?? StatusCode.unknown.rawValue
        case .grpcMessage: s.grpcMessage = PercentEncoding.decode(String(nghttp2: value, count: valueLen))
        case .grpcStatusDetailsBin: s.statusDetails = Base64.decode(String(nghttp2: value, count: valueLen))
        case .metadata:
            let n = String(nghttp2: name, count: nameLen)
            if HeaderName.isBinary(nameBytes) {
                if let b = Base64.decode(String(nghttp2: value, count: valueLen)) { s.headers.add(lowercased: n, .binary(b)) }
            } else {
                s.headers.add(lowercased: n, .string(String(nghttp2: value, count: valueLen)))
            }
        case .method, .path, .authority, .scheme, .otherPseudo, .te, .userAgent, .host, .grpcTimeout,
            .grpcAcceptEncoding, .otherGRPC, .otherReserved:
            break
        }
        return 0
    }

    func onFrameRecv(_ frame: UnsafePointer<nghttp2_frame>) -> Int32 {
        let hd = frame.pointee.hd
        if hd.type == UInt8(NGHTTP2_GOAWAY.rawValue) {
            // No new calls on this connection; the channel opens another one.
            isUsable = false
            onClose()
            return 0
        }
        // Not retained (see `withStream`); a stream refused at its headers is removed
        // after.
        if withStream(hd.stream_id, { onFrameRecv(frame, $0) }) == true { streams[hd.stream_id] = nil }
        return 0
    }

    /// True when the stream is to be removed now (its headers ended the call).
    private func onFrameRecv(_ frame: UnsafePointer<nghttp2_frame>, _ s: ClientStreamState) -> Bool {
        let hd = frame.pointee.hd
        let endStream = hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        if hd.type == UInt8(NGHTTP2_HEADERS.rawValue) {
            if !s.headersReceived {
                s.headersReceived = true
                if s.responseStatus != 200 || (!s.isGRPCContentType && s.grpcStatus == nil) {
                    let code = s.grpcStatus.flatMap(StatusCode.init(rawValue:)) ?? StatusCode(httpStatus: s.responseStatus)
                    let message =
                        s.grpcStatus != nil
                        ? s.grpcMessage
                        : "unexpected HTTP status \(s.responseStatus) (content-type '\(s.contentType)')"
                    finishStream(s, status: RPCStatus(code, message), trailers: s.headers)
                    releaseHeld(s)
                    return true
                }
                if endStream {
                    // Trailers-Only: headers and status in one block.
                    let metadata = s.headers
                    s.headersArrived(metadata)
                    finishWithTrailers(s, metadata)
                    return false
                }
                s.headersArrived(s.headers)
                s.headers = Metadata()
            } else {
                finishWithTrailers(s, s.headers)
            }
        } else if hd.type == UInt8(NGHTTP2_DATA.rawValue) && endStream && s.grpcStatus == nil {
            finishStream(s, status: RPCStatus(.internal, "server closed the stream without sending a status"), trailers: Metadata())
        }
        return false
    }

    private func finishWithTrailers(_ s: ClientStreamState, _ trailers: Metadata) {
        if s.deframer.hasPartialMessage {
            return finishStream(s, status: RPCStatus(.internal, "response ended inside a message"), trailers: trailers)
        }
        guard let raw = s.grpcStatus else {
            return finishStream(s, status: RPCStatus(.internal, "missing grpc-status in trailers"), trailers: trailers)
        }
        let code = StatusCode(rawValue: raw) ?? .unknown
        var t = trailers
        if let d = s.statusDetails { t.add("grpc-status-details-bin", binary: d) }
        finishStream(s, status: RPCStatus(code, s.grpcMessage), trailers: t)
    }

    func onDataChunk(_ id: Int32, _ data: UnsafePointer<UInt8>, _ len: Int) -> Int32 {
        guard let session else { return 0 }
        // Not retained: see `withStream`.
        if let r = withStream(id, { onDataChunk(session, $0, data, len) }) { return r }
        nghttp2_session_consume(session, id, len)
        return 0
    }

    private func onDataChunk(_ session: OpaquePointer, _ s: ClientStreamState, _ data: UnsafePointer<UInt8>, _ len: Int) -> Int32 {
        let id = s.id
        // Bytes of the message in progress held back by earlier chunks: they belong to the first
        // message this chunk completes.
        var carried = s.heldPartial
        s.heldPartial = 0
        do throws(MessageDeframer.Failure) {
            let partial = try s.deframer.feed(UnsafeRawBufferPointer(start: data, count: len)) { frame, ownBytes in
                let deferred = ownBytes + carried
                carried = 0
                var payload = frame.payload
                if frame.compressed {
                    guard s.encoding == "gzip", let inflated = try? Gzip.decompress(payload, limit: configuration.maxReceiveMessageSize) else {
                        nghttp2_session_consume(session, id, deferred)
                        cancel(
                            id,
                            status: RPCStatus(
                                .internal, "compressed response message could not be decompressed (grpc-encoding '\(s.encoding ?? "")')"))
                        return
                    }
                    payload = inflated
                }
                // The window for this message opens when the caller reads it (at once for a
                // unary call's collector).
                s.heldBytes += deferred
                if s.received(.init(bytes: payload, compressed: frame.compressed, wireSize: deferred)) {
                    s.heldBytes -= deferred
                    nghttp2_session_consume(session, id, deferred)
                }
            }
            // An unfinished message's bytes are given back at once, so a message larger than the
            // window can arrive; but not while the reader is behind (completed messages unread):
            // then they wait with it, or a reader that stopped would not hold the server back
            // (only each message's last chunk would), and a relay would buffer the stream.
            let unfinished = partial + carried
            if unfinished > 0 {
                if s.heldBytes > 0 { s.heldPartial = unfinished } else { nghttp2_session_consume(session, id, unfinished) }
            }
        } catch {
            if carried > 0 { nghttp2_session_consume(session, id, carried) }
            nghttp2_session_consume(session, id, len)
            switch error {
            case .tooLarge(let n):
                cancel(
                    id,
                    status: RPCStatus(
                        .resourceExhausted, "response message of \(n) bytes exceeds the limit of \(configuration.maxReceiveMessageSize) bytes"))
            case .badFlag(let f):
                cancel(id, status: RPCStatus(.internal, "invalid gRPC message flag \(f)"))
            case .overBudget:
                break  // only the server's feed admits messages
            }
        }
        return 0
    }

    func onStreamClose(_ id: Int32, _ code: UInt32) -> Int32 {
        lending.checkNoneLent()
        guard let s = streams.removeValue(forKey: id) else { return 0 }
        releaseHeld(s)
        if !s.isFinished {
            let status: RPCStatus =
                switch code {
                case NGHTTP2_REFUSED_STREAM.rawValue: RPCStatus(.unavailable, "the server refused the stream (too many concurrent streams)")
                case NGHTTP2_CANCEL.rawValue: RPCStatus(.cancelled, "the server cancelled the stream")
                case NGHTTP2_ENHANCE_YOUR_CALM.rawValue: RPCStatus(.resourceExhausted, "the server asked to slow down (ENHANCE_YOUR_CALM)")
                case NGHTTP2_INADEQUATE_SECURITY.rawValue: RPCStatus(.permissionDenied, "inadequate security")
                default: RPCStatus(.internal, "stream closed with HTTP/2 error \(code) before a status")
                }
            finishStream(s, status: status, trailers: Metadata())
        }
        return 0
    }
}

/// Calls `body` with the connection nghttp2 calls back for, without a retain and release per
/// callback (several per call): nghttp2 calls back only from inside the connection's own calls
/// (mem_recv, mem_send, submit), while the connection is alive.
@inline(__always)
private func clientHandler<R>(_ p: UnsafeMutableRawPointer?, _ body: (ClientConnectionHandler) -> R) -> R {
    Unmanaged<ClientConnectionHandler>.fromOpaque(p!)._withUnsafeGuaranteedRef(body)
}
private let clientOnHeader: nghttp2_on_header_callback = { _, frame, name, nameLen, value, valueLen, _, user in
    clientHandler(user) { $0.onHeader(frame!, name!, nameLen, value!, valueLen) }
}
private let clientOnFrameRecv: nghttp2_on_frame_recv_callback = { _, frame, user in
    clientHandler(user) { $0.onFrameRecv(frame!) }
}
private let clientOnDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, id, data, len, user in
    clientHandler(user) { $0.onDataChunk(id, data!, len) }
}
private let clientOnStreamClose: nghttp2_on_stream_close_callback = { _, id, code, user in
    clientHandler(user) { $0.onStreamClose(id, code) }
}
private let clientReadData: nghttp2_data_source_read_callback = { _, id, buf, length, flags, _, user in
    clientHandler(user) { $0.readData(id, buf!, length, flags!) }
}
