import CNGHTTP2
import CNGHTTP2Memory
import Logging
import NIOCore
import RPCCore

#if canImport(Glibc)
import Glibc
#endif

/// One HTTP/2 connection of a gRPC server: bytes in → `nghttp2_session_mem_recv`, nghttp2 callbacks
/// build per-stream state and start handlers, `nghttp2_session_mem_send` → bytes out. Every nghttp2
/// call for the connection runs on its event loop; handler tasks run there too (see
/// `EventLoopTaskExecutor`) and report back through `NIOLoopBound`.
final class ServerConnectionHandler: ChannelInboundHandler, RemovableChannelHandler, DrainableConnection {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let shared: ServerShared
    private(set) var session: OpaquePointer?
    var streams = StreamTable<ServerStream>()
    private var context: ChannelHandlerContext?
    private var executor: EventLoopTaskExecutor?
    private var peer = ""
    /// The peer's IP address, once per connection (every call's `ServerContext.peerHost`).
    private var peerHost = ""
    private var flushScheduled = false
    private var inCallback = false
    private var shuttingDown = false
    private var closed = false

    /// Read once: the hot path asks for every header.
    private let keepsRawHeaders: Bool
    /// The output buffer reused across flushes (see `drainSessionOutput`).
    private var outputScratch: ByteBuffer?
    /// Large request messages of this connection: admitted, or waiting for room.
    var budget: ConnectionRequestBudget
    /// Messages up to this wire size (half the stream window) are small: held whole within their
    /// stream's window.
    private let smallLimit: Int
    private let processBudget: RequestBudget
    private let processLimit: Int
    /// Plain-HTTP body bytes past this many are charged to the process budget.
    private let httpUncharged: Int
    private let interceptors: ServerInterceptors
    /// The server's observer for this connection's loop (`onLoop`).
    private var observer: (any ServerCallObserver)?
    /// `observer.readsCallDetails`, asked once.
    private var observerReadsDetails = true

    // Connection management (`ServerConfiguration`: keepalive, idle, age).
    /// Reads so far (wraps): keepalive compares it across ticks instead of reading a clock per read.
    private var reads = 0
    private var readsAtTick = 0
    private var pingTimeout: Scheduled<Void>?
    /// Streams begun so far (wraps) and at the last idle tick.
    private var streamsBegun = 0
    private var streamsAtIdleTick = 0
    private var idleTicks = 0
    private var timers: [RepeatedTask] = []
    private var ageTimer: Scheduled<Void>?
    private var graceTimer: Scheduled<Void>?
    /// The first request headers have been reported to the `ConnectionGuard`.
    private var sawRequest = false

    // Per-call allocations saved by reuse (all on the loop).
    /// Header blocks for responses and trailers, kept once submitted (nghttp2 copies them).
    private var spareBlocks: [HeaderBlock] = []
    /// The headers of the request whose header block is arriving (one at a time: HTTP/2 does not
    /// interleave header blocks), until its content-type says gRPC; a plain HTTP request takes
    /// them when its headers are complete.
    private var headScratch = HeaderBlock(capacity: 0)
    /// Paths seen lately: a request for one of them shares its string instead of making one.
    private var recentPaths: [String] = []
    /// The last request's `:authority`, shared likewise (a client names the same server on every
    /// call).
    private var lastAuthority = ""
    private var recentRoutes: [(path: String, method: ServerMethod)] = []
    /// Metadata values too long for a small string seen lately (a client's access token, a
    /// peer's credential: the same bytes on every call of a connection): a request carrying one
    /// shares its string instead of allocating and validating a copy. At most
    /// `recentValueSlots` values of at most `recentValueMaxBytes` bytes each.
    private var recentValues: [String] = []
    private var recentValueNext = 0
    static let recentValueSlots = 4
    static let recentValueMaxBytes = 1024
    /// The metadata of the request whose header block is arriving (one at a time, as
    /// `headScratch`), as its bytes: a relayed call takes them as they are (`RawHandler.unaryRelay`),
    /// any other call gets them as `Metadata` when its headers are complete (the bytes' storage
    /// then stays here for the next request).
    private var metadataScratch = MetadataBytes()
    /// What this connection reuses with the others of its loop (set when it is added).
    private var loopScratch = LoopScratch()
    /// This connection as relayed calls see it (made at the first one).
    private var relayConnection: RelayConnection?

    init(shared: ServerShared) {
        self.shared = shared
        let config = shared.configuration
        self.keepsRawHeaders = config.httpHandler != nil
        self.budget = ConnectionRequestBudget(limit: config.maxBufferedRequestBytesPerConnection)
        // Half the window: nghttp2 sends a WINDOW_UPDATE only once half of it is consumed, so
        // up to half may be read but not yet reopened; a message within the other half always
        // arrives whole.
        self.smallLimit = max(1, Int(HTTP2Setting.window(config.initialWindowSize)) / 2)
        self.processBudget = config.requestBudget
        self.processLimit = config.maxBufferedRequestBytesPerProcess
        self.httpUncharged = Int(HTTP2Setting.window(config.initialWindowSize))
        self.interceptors = ServerInterceptors(config.interceptors)
        self.observer = config.observer
    }

    // MARK: Channel lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.executor = EventLoopTaskExecutor(context.eventLoop)
        self.loopScratch = shared.scratch(for: context.eventLoop)
        self.observer = observer?.onLoop(ObjectIdentifier(context.eventLoop))
        self.observerReadsDetails = observer?.readsCallDetails ?? true
        self.peer = context.channel.remoteAddress.map(Self.describe) ?? "unknown"
        self.peerHost = context.channel.remoteAddress?.ipAddress ?? ServerContext.host(ofPeer: peer)
        startSession()
        shared.registry.add(self, loop: context.eventLoop)
        startTimers(context)
        if context.channel.isActive { flush() }
    }

    private func startTimers(_ context: ChannelHandlerContext) {
        let config = shared.configuration
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loop = context.eventLoop
        if let every = config.keepaliveTime {
            timers.append(
                loop.scheduleRepeatedTask(initialDelay: TimeAmount(every), delay: TimeAmount(every)) { _ in
                    bound.value.keepaliveTick()
                })
        }
        if let idle = config.maxConnectionIdle {
            // Four quiet ticks in a row: idle for at least `idle`, closed within 1¼ of it.
            let tick = TimeAmount(idle / 4)
            timers.append(loop.scheduleRepeatedTask(initialDelay: tick, delay: tick) { _ in bound.value.idleTick() })
        }
        if let age = config.maxConnectionAge {
            let jittered = age * Double.random(in: 0.9...1.1)
            ageTimer = loop.scheduleTask(in: TimeAmount(jittered)) { bound.value.maxAgeReached() }
        }
    }

    private func stopTimers() {
        for t in timers { t.cancel() }
        timers = []
        pingTimeout?.cancel()
        pingTimeout = nil
        ageTimer?.cancel()
        ageTimer = nil
        graceTimer?.cancel()
        graceTimer = nil
    }

    /// Nothing read for a whole `keepaliveTime`: PING, and close if nothing at all (the ACK or
    /// anything else) is read within `keepaliveTimeout`.
    private func keepaliveTick() {
        guard let session, let context, pingTimeout == nil else { return }
        if reads != readsAtTick {
            readsAtTick = reads
            return
        }
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        flush()
        let snapshot = reads
        let timeout = shared.configuration.keepaliveTimeout
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        pingTimeout = context.eventLoop.scheduleTask(in: TimeAmount(timeout)) {
            let h = bound.value
            h.pingTimeout = nil
            if h.reads == snapshot {
                h.shared.logger.debug("closing connection from \(h.peer): no answer to a keepalive PING within \(timeout)")
                h.closeConnection()
            } else {
                h.readsAtTick = h.reads
            }
        }
    }

    /// No stream open and none begun for four ticks: GOAWAY, then the connection closes itself.
    private func idleTick() {
        if streams.isEmpty && streamsBegun == streamsAtIdleTick {
            idleTicks += 1
            if idleTicks >= 4 {
                shared.logger.debug("closing idle connection from \(peer) (maxConnectionIdle)")
                beginGracefulShutdown()
            }
        } else {
            idleTicks = 0
            streamsAtIdleTick = streamsBegun
        }
    }

    /// `maxConnectionAge`: graceful GOAWAY now, hard close after the grace period.
    private func maxAgeReached() {
        ageTimer = nil
        guard let context, !closed else { return }
        shared.logger.debug("connection from \(peer) reached its maximum age: GOAWAY")
        beginGracefulShutdown()
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        graceTimer = context.eventLoop.scheduleTask(in: TimeAmount(shared.configuration.maxConnectionAgeGrace)) {
            bound.value.forceClose()
        }
    }

    func channelActive(context: ChannelHandlerContext) {
        flush()
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        teardown()
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        teardown()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let session else { return }
        reads &+= 1
        let buffer = unwrapInboundIn(data)
        // The upstream connections this read starts a lone call on are written when it is done.
        let rv = readFlushes.duringRequestsRead {
            buffer.withUnsafeReadableBytes { bytes -> Int in
                inCallback = true
                defer { inCallback = false }
                return nghttp2_session_mem_recv(session, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count)
            }
        }
        if rv < 0 {
            // Bad preface or a connection-level protocol error: nghttp2 has queued GOAWAY where it can.
            shared.logger.debug("closing connection from \(peer): \(String(cString: nghttp2_strerror(Int32(rv))))")
            flush()
            closeConnection()
            return
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

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        shared.logger.debug("connection error from \(peer): \(error)")
        closeConnection()
    }

    private func startSession() {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, serverOnBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, serverOnHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, serverOnFrameRecv)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, serverOnDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, serverOnStreamClose)

        var option: OpaquePointer?
        nghttp2_option_new(&option)
        defer { nghttp2_option_del(option) }
        // We open the flow-control window as handlers read (backpressure), not as bytes arrive.
        nghttp2_option_set_no_auto_window_update(option, 1)
        // Rapid-Reset protection stays on, at nghttp2's own defaults (burst 1000, 33/s).
        nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33)
        nghttp2_option_set_max_continuations(option, 8)

        var s: OpaquePointer?
        // nghttp2 allocates through per-thread free lists (CNGHTTP2Memory): a dozen blocks a call.
        nghttp2_session_server_new3(&s, callbacks, Unmanaged.passUnretained(self).toOpaque(), option, rpc_nghttp2_memory())
        session = s
        let config = shared.configuration
        var settings = [
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: HTTP2Setting.value(config.maxConcurrentStreams)),
            // RFC 9218: no RFC 7540 priority tree, and no closed streams kept for it.
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: HTTP2Setting.value(config.maxHeaderListSize)),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: HTTP2Setting.window(config.initialWindowSize)),
        ]
        nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        let connectionWindow =
            config.connectionWindowSize.map { Int32(clamping: min(max($0, 65535), HTTP2Setting.maxWindow)) }
            ?? HTTP2Setting.connectionWindow(streamWindow: config.initialWindowSize, streams: config.maxConcurrentStreams)
        nghttp2_session_set_local_window_size(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, connectionWindow)
    }

    private func teardown() {
        guard !closed else { return }
        closed = true
        stopTimers()
        shared.registry.remove(self)
        for stream in streams.all {
            releaseCharges(stream)
            abandon(stream)
        }
        lending.checkNoneLent()
        streams.removeAll()
        owner = nil  // it refers to this connection: no cycle left behind
        if let session { nghttp2_session_del(session) }
        session = nil
    }

    private func closeConnection() {
        guard let context, !closed else { return }
        context.close(promise: nil)
    }

    /// GOAWAY with the last stream we accepted; streams already running finish, then the
    /// connection closes itself once nghttp2 has nothing left to read or write.
    func beginGracefulShutdown() {
        guard let session, !shuttingDown else { return }
        shuttingDown = true
        nghttp2_submit_goaway(
            session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(session),
            NGHTTP2_NO_ERROR.rawValue, nil, 0)
        // Streamed HTTP responses (browser streams) would hold the connection for as long as
        // they live: their handlers are cancelled, so each ends with its protocol's last frame.
        for stream in streams.all where stream.isHTTP && stream.phase == .running && stream.headersSent && !stream.httpComplete {
            stream.cancelHandler()
        }
        flush()
    }

    /// Hard stop at the end of the grace period.
    func forceClose() {
        for stream in streams.all { stream.cancelHandler() }
        closeConnection()
    }

    // MARK: Output

    /// Drains nghttp2's output into the channel. Stops while the socket is not writable: DATA is
    /// pulled lazily from stream buffers, so nothing piles up beyond what handlers may queue.
    func flush() {
        flushScheduled = false
        guard let context, let session, !inCallback else { return }
        // Most flushes (each read's end, each answer's) find nothing queued: say so without
        // touching the channel or the output buffer.
        if nghttp2_session_want_write(session) == 0 {
            if nghttp2_session_want_read(session) == 0 { closeConnection() }
            return
        }
        let (error, reuse) = drainSessionOutput(session, into: context, reusing: outputScratch.take())
        if let reuse { outputScratch = reuse }
        if let error {
            shared.logger.debug("nghttp2 send error: \(String(cString: nghttp2_strerror(error)))")
            closeConnection()
            return
        }
        // The flush may have ended the connection (a write error closes it at once): look again.
        guard let session = self.session else { return }
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            closeConnection()
        }
    }

    /// This loop's deferred flushes (`ReadFlushes`), found on first use, on the loop.
    private lazy var readFlushes = ReadFlushes.forThisThread

    /// Coalesces output from handler completions that land in the same event-loop tick: at the
    /// end of the client connection's read that produced it (a relay's answers), else in a task.
    func scheduleFlush() {
        guard !flushScheduled, let context else { return }
        flushScheduled = true
        if readFlushes.isReading {
            readFlushes.flushAfterRead(self)
            return
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.execute { bound.value.flush() }
    }

    // MARK: nghttp2 callbacks (called only from inside mem_recv / mem_send)

    /// `body` with the stream of `id`, unretained (`StreamLending`).
    private let lending = StreamLending()

    @inline(__always)
    private func withStream<R>(_ id: Int32, _ body: (ServerStream) -> R) -> R? { lending.with(streams.unretained(id), body) }

    func onBeginHeaders(_ frame: UnsafePointer<nghttp2_frame>) -> Int32 {
        let hd = frame.pointee.hd
        guard hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
            frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST,
            context != nil
        else { return 0 }
        let stream = ServerStream(id: hd.stream_id, maxMessageSize: shared.configuration.maxReceiveMessageSize)
        streams[hd.stream_id] = stream
        headScratch.removeAll()
        metadataScratch.removeAll()
        streamsBegun &+= 1
        return 0
    }

    func onHeader(
        _ frame: UnsafePointer<nghttp2_frame>, _ name: UnsafePointer<UInt8>, _ nameLen: Int,
        _ value: UnsafePointer<UInt8>, _ valueLen: Int
    ) -> Int32 {
        // Not retained (a dozen headers per call): see `withStream`.
        withStream(frame.pointee.hd.stream_id) { onHeader($0, name, nameLen, value, valueLen) } ?? 0
    }

    private func onHeader(
        _ stream: ServerStream, _ name: UnsafePointer<UInt8>, _ nameLen: Int, _ value: UnsafePointer<UInt8>, _ valueLen: Int
    ) -> Int32 {
        guard stream.phase == .receivingHeaders else { return 0 }
        stream.headerListSize += nameLen + valueLen + 32
        if stream.headerListSize > shared.configuration.maxHeaderListSize {
            stream.headersTooLarge = true
            return 0
        }
        if stream.headersTooLarge { return 0 }
        let nameBytes = UnsafeRawBufferPointer(start: name, count: nameLen)
        let valueBytes = UnsafeRawBufferPointer(start: value, count: valueLen)
        switch HeaderName.classify(nameBytes) {
        case .method: stream.method = Self.method(value, valueLen)
        case .path: stream.path = path(value, valueLen)
        case .authority: stream.authority = authority(value, valueLen)
        case .host: if stream.authority.isEmpty { stream.authority = authority(value, valueLen) }
        case .contentType:
            stream.isGRPCContentType = HeaderName.isGRPCContentType(valueBytes)
            if stream.isGRPCContentType {
                headScratch.removeAll()
            } else {
                stream.contentType = String(nghttp2: value, count: valueLen)
            }
        case .grpcTimeout: stream.timeout = String(nghttp2: value, count: valueLen)
        case .grpcEncoding: stream.encoding = String(nghttp2: value, count: valueLen)
        case .grpcAcceptEncoding: stream.clientAcceptsGzip = HeaderName.listsGzip(valueBytes)
        case .metadata:
            // As bytes until the headers are complete (`takeMetadata`).
            metadataScratch.appendUnchecked(name: nameBytes, value: valueBytes)
        case .scheme, .status, .otherPseudo, .te, .userAgent, .grpcStatus, .grpcMessage, .grpcStatusDetailsBin,
            .otherGRPC, .otherReserved:
            break
        }
        // Plain HTTP requests (the configured HTTPHandler) get every header; which kind a request
        // is shows only once its headers are complete, so they are kept as bytes until then. Not
        // once the content-type says gRPC (classified above): those kept before it are dropped
        // then, and it and later ones are never copied (gRPC clients send it first).
        if keepsRawHeaders && !stream.isGRPCContentType && (nameLen == 0 || name[0] != UInt8(ascii: ":")) {
            headScratch.add(name, nameLen, value, valueLen)
        }
        return 0
    }

    /// `:method`: the two every gRPC and browser request uses as constants, anything else
    /// decoded (no string made and validated per call: ≈ 1% of a relayed call's instructions,
    /// with `authority`).
    private static func method(_ value: UnsafePointer<UInt8>, _ count: Int) -> String {
        if count == 4 && value[0] == UInt8(ascii: "P") && value[1] == UInt8(ascii: "O") && value[2] == UInt8(ascii: "S")
            && value[3] == UInt8(ascii: "T")
        {
            return "POST"
        }
        if count == 3 && value[0] == UInt8(ascii: "G") && value[1] == UInt8(ascii: "E") && value[2] == UInt8(ascii: "T") {
            return "GET"
        }
        return String(nghttp2: value, count: count)
    }

    /// The request's `:authority` (or `host`): the connection's last one when the bytes are the
    /// same.
    private func authority(_ value: UnsafePointer<UInt8>, _ count: Int) -> String {
        guard count > 0 else { return "" }
        if Self.holds(lastAuthority, value, count) { return lastAuthority }
        let a = String(nghttp2: value, count: count)
        lastAuthority = a
        return a
    }

    /// Whether `string`'s UTF-8 is exactly the `count` bytes at `value` (a header a string made
    /// earlier can stand for).
    @inline(__always)
    private static func holds(_ string: String, _ value: UnsafePointer<UInt8>, _ count: Int) -> Bool {
        guard string.utf8.count == count else { return false }
        if count == 0 { return true }
        return string.utf8.withContiguousStorageIfAvailable { memcmp($0.baseAddress!, value, count) == 0 } ?? false
    }

    /// The request's `:path`, shared with an earlier request's when it is one of the last few
    /// seen (clients call the same methods over and over).
    private func path(_ value: UnsafePointer<UInt8>, _ count: Int) -> String {
        for p in recentPaths where Self.holds(p, value, count) { return p }
        let p = String(nghttp2: value, count: count)
        if recentPaths.count < 8 { recentPaths.append(p) } else { recentPaths[streamsBegun & 7] = p }
        return p
    }

    /// The request's metadata, its headers complete: as bytes for a relay (the scratch's storage
    /// goes with them), as `Metadata` for any other handler (the storage stays). A `-bin` value
    /// that is not valid base64 fails the call (`badMetadata`) either way.
    private func takeMetadata(_ stream: ServerStream, relayed: Bool) {
        if relayed {
            metadataScratch.checkEntries()
            if metadataScratch.contains(name: { MetadataBytes.isBinaryName($0) }) {
                metadataScratch.forEach { name, value in
                    if MetadataBytes.isBinaryName(name), Base64.decode(String(decoding: value, as: UTF8.self)) == nil {
                        stream.badMetadata = "metadata '\(String(decoding: name, as: UTF8.self))' is not valid base64"
                        return false
                    }
                    return true
                }
            }
            // The stream takes the bytes; the scratch goes on with a spare's storage.
            var spare = loopScratch.spareMetadata.popLast() ?? MetadataBytes()
            swap(&spare, &metadataScratch)
            stream.relayMetadata = spare
            return
        }
        guard !metadataScratch.isEmpty else { return }
        var metadata = Metadata()
        metadataScratch.forEach { name, value in
            let n = String(decoding: name, as: UTF8.self)
            if MetadataBytes.isBinaryName(name) {
                if let bytes = Base64.decode(String(decoding: value, as: UTF8.self)) {
                    metadata.add(lowercased: n, .binary(bytes))
                } else if stream.badMetadata == nil {
                    stream.badMetadata = "metadata '\(n)' is not valid base64"
                }
            } else {
                metadata.add(lowercased: n, .string(metadataValue(value)))
            }
            return true
        }
        stream.metadata = metadata
    }

    /// A text metadata value: one of the connection's recent long values when it has the same
    /// bytes (small strings, up to 15 bytes, cost no allocation and are made afresh).
    private func metadataValue(_ value: UnsafeRawBufferPointer) -> String {
        let count = value.count
        guard count > 15, count <= Self.recentValueMaxBytes, let base = value.baseAddress else {
            return String(decoding: value, as: UTF8.self)
        }
        for v in recentValues where v.utf8.count == count {
            let same = v.utf8.withContiguousStorageIfAvailable { memcmp($0.baseAddress!, base, count) == 0 } ?? false
            if same { return v }
        }
        let v = String(decoding: value, as: UTF8.self)
        if recentValues.count < Self.recentValueSlots {
            recentValues.append(v)
        } else {
            recentValues[recentValueNext] = v
            recentValueNext = (recentValueNext + 1) % Self.recentValueSlots
        }
        return v
    }

    /// The method of a `:path`, from the last few found on this connection when it is one of
    /// them (the same string as `path` shares: compared by storage first), else the router's
    /// table (which hashes the whole path). Only found methods are kept.
    private func route(_ path: String) -> Result<ServerMethod, RPCError> {
        for r in recentRoutes where r.path == path { return .success(r.method) }
        let found = shared.router.lookup(path)
        if case .success(let method) = found {
            if recentRoutes.count < 8 { recentRoutes.append((path, method)) } else { recentRoutes[streamsBegun & 7] = (path, method) }
        }
        return found
    }

    private func takeBlock() -> HeaderBlock { spareBlocks.popLast() ?? HeaderBlock() }

    private func recycle(_ block: consuming HeaderBlock) {
        if block.isShared { return }
        // Enough for the trailers of the calls answered in one read, a few KiB at most.
        guard spareBlocks.count < 16 else { return }
        var b = block
        b.removeAll()
        spareBlocks.append(b)
    }

    func onFrameRecv(_ frame: UnsafePointer<nghttp2_frame>) -> Int32 {
        withStream(frame.pointee.hd.stream_id) { onFrameRecv(frame, $0) } ?? 0
    }

    private func onFrameRecv(_ frame: UnsafePointer<nghttp2_frame>, _ stream: ServerStream) -> Int32 {
        let hd = frame.pointee.hd
        let endStream = hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        if hd.type == UInt8(NGHTTP2_HEADERS.rawValue) {
            if stream.phase == .receivingHeaders && frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
                stream.phase = .receiving
                acceptCall(stream)
            }
            if endStream { inputEnded(stream) }
        } else if hd.type == UInt8(NGHTTP2_DATA.rawValue) && endStream {
            inputEnded(stream)
        }
        return 0
    }

    func onDataChunk(_ streamID: Int32, _ data: UnsafePointer<UInt8>, _ len: Int) -> Int32 {
        guard let session else { return 0 }
        if let r = withStream(streamID, { onDataChunk(session, $0, data, len) }) { return r }
        // Data for a stream already closed: give the window back and drop it.
        nghttp2_session_consume(session, streamID, len)
        return 0
    }

    private func onDataChunk(_ session: OpaquePointer, _ stream: ServerStream, _ data: UnsafePointer<UInt8>, _ len: Int) -> Int32 {
        let streamID = stream.id
        if stream.isHTTP, stream.phase == .receiving {
            receivedHTTPBody(stream, data, len)
            return 0
        }
        guard stream.phase == .receiving || stream.phase == .running, stream.target != nil, !stream.inputClosed else {
            // Data for a stream we already answered: give the window back and drop it.
            nghttp2_session_consume(session, streamID, len)
            return 0
        }
        // The closures must not touch `stream.deframer` (it is being mutated): a message that
        // fails the call only marks it done, and its buffers are released after the feed.
        let limit = stream.deframer.maxMessageSize
        do throws(MessageDeframer.Failure) {
            try stream.deframer.feedServer(
                UnsafeRawBufferPointer(start: data, count: len), smallLimit: smallLimit,
                admit: { bytes in admit(stream, bytes) },
                emit: { frame, held, charged in receivedMessage(stream, frame, held: held, charged: charged, limit: limit) })
            let release = stream.deframer.takeRelease()
            if release > 0 { nghttp2_session_consume(session, streamID, release) }
            if stream.phase == .done { releaseRequestBuffers(stream) }
        } catch {
            switch error {
            case .tooLarge(let size):
                fail(
                    stream,
                    RPCError(
                        .resourceExhausted,
                        "request message of \(size) bytes exceeds the limit of \(stream.deframer.maxMessageSize) bytes for \(stream.path)"))
            case .badFlag(let flag):
                fail(stream, RPCError(.internal, "invalid gRPC message flag \(flag)"))
            case .overBudget(let size):
                fail(stream, Self.overBudget(size))
            }
            releaseRequestBuffers(stream)
        }
        return 0
    }

    static func overBudget(_ size: Int) -> RPCError {
        RPCError.resourceExhausted(
            "the server is busy receiving other large requests (this one declares \(size) bytes): retry shortly",
            retryAfter: .seconds(1))
    }

    /// A large message's prefix arrived: admitted against the connection's budget, then the
    /// process's; waiting when the connection has no room; refused when the process has none.
    private func admit(_ stream: ServerStream, _ bytes: Int) -> MessageDeframer.Admission {
        switch budget.request(stream: stream.id, bytes: bytes) {
        case .wait:
            // What it may hold while it waits (its window) counts for the process too, so waiting
            // streams of many connections cannot add up past the budget.
            guard processBudget.tryCharge(smallLimit, limit: processLimit) else {
                budget.cancelWait(stream: stream.id)
                return .refused
            }
            stream.awaitingAdmission = true
            stream.waitCharged = smallLimit
            return .wait
        case .admitted:
            guard processBudget.tryCharge(bytes, limit: processLimit) else {
                budget.release(bytes)
                return .refused
            }
            stream.charged += bytes
            return .admitted
        }
    }

    /// Gives back `bytes` of the stream's charge (a message reached its handler) and lets in
    /// messages that waited for the room.
    func releaseCharge(_ stream: ServerStream, _ bytes: Int) {
        let n = min(bytes, stream.charged)
        guard n > 0 else { return }
        stream.charged -= n
        budget.release(n)
        processBudget.release(n)
        admitWaitingMessages()
    }

    private func admitWaitingMessages() {
        for (id, bytes) in budget.admitWaiting() {
            guard let s = streams[id], s.awaitingAdmission, s.phase != .done, let session else {
                budget.release(bytes)
                continue
            }
            endWait(s)
            guard processBudget.tryCharge(bytes, limit: processLimit) else {
                budget.release(bytes)
                fail(s, Self.overBudget(bytes))
                releaseRequestBuffers(s)
                continue
            }
            s.charged += bytes
            let held = s.deframer.admitPartial(charged: bytes)
            if held > 0 { nghttp2_session_consume(session, id, held) }
            scheduleFlush()
        }
    }

    /// The stream will read no more request bytes (answered early, failed, or gone): every byte
    /// it held goes back to flow control and every charge to the budgets.
    private func releaseRequestBuffers(_ stream: ServerStream) {
        let held = stream.deframer.dropPartial().held + stream.deframer.takeRelease() + stream.heldBytes
        stream.heldBytes = 0
        stream.single = nil
        stream.streamingPart?.unreadCharges = [:]
        if held > 0, let session { nghttp2_session_consume(session, stream.id, held) }
        releaseCharges(stream)
    }

    /// The stream's message no longer waits (admitted, completed within its window, or gone).
    private func endWait(_ stream: ServerStream) {
        stream.awaitingAdmission = false
        if stream.waitCharged > 0 {
            processBudget.release(stream.waitCharged)
            stream.waitCharged = 0
        }
    }

    /// Budgets only (the stream is gone from nghttp2, or the connection is).
    private func releaseCharges(_ stream: ServerStream) {
        if stream.awaitingAdmission {
            endWait(stream)
            budget.cancelWait(stream: stream.id)
        }
        if stream.httpCharged > 0 {
            processBudget.release(stream.httpCharged)
            stream.httpCharged = 0
        }
        releaseCharge(stream, stream.charged)
    }

    /// A plain-HTTP request's body: consumed at once (it goes to the handler whole), capped by
    /// the request's limit; bytes past `smallLimit` are charged to the process budget.
    private func receivedHTTPBody(_ stream: ServerStream, _ data: UnsafePointer<UInt8>, _ len: Int) {
        guard let session else { return }
        nghttp2_session_consume(session, stream.id, len)
        let total = stream.httpBody.count + len
        if total > stream.httpLimit {
            stream.phase = .done
            let head = HTTPRequest(
                method: stream.method, target: stream.path, headers: stream.httpHeaderPairs ?? stream.rawHeaders.pairs, body: [], peer: peer)
            respondHTTP(
                stream, shared.configuration.httpHandler?.bodyTooLarge(head, limit: stream.httpLimit) ?? .bodyTooLarge(limit: stream.httpLimit))
            releaseRequestBuffers(stream)
            return
        }
        let over = max(0, total - httpUncharged) - stream.httpCharged
        if over > 0 {
            guard processBudget.tryCharge(over, limit: processLimit) else {
                stream.phase = .done
                respondHTTP(stream, .busy)
                stream.httpBody = []
                releaseRequestBuffers(stream)
                return
            }
            stream.httpCharged += over
        }
        stream.httpBody.append(contentsOf: UnsafeBufferPointer(start: data, count: len))
    }

    func onStreamClose(_ streamID: Int32, _ errorCode: UInt32) -> Int32 {
        lending.checkNoneLent()
        guard let stream = streams.removeValue(forKey: streamID) else { return 0 }
        // Unread request bytes go back to the connection window (the stream is gone), charges
        // to the budgets.
        releaseRequestBuffers(stream)
        abandon(stream)
        return 0
    }

    /// The stream is gone (closed by either side, or the connection ended): stop its handler.
    private func abandon(_ stream: ServerStream) {
        let wasRunning = stream.phase == .running
        stream.phase = .done
        stream.deadlineTimer?.cancel()
        stream.deadlineTimer = nil
        if wasRunning { stream.cancelHandler() }
        stream.requestStream?.finish(throwing: RPCError.cancelled("the client cancelled the call"))
        for w in stream.takeWriters().waiters { w.resume(throwing: RPCError.cancelled("the client cancelled the call")) }
        observeEnd(stream, .cancelled)
    }

    // MARK: Calls

    /// Request headers are complete: validate them and pick the method.
    private func acceptCall(_ stream: ServerStream) {
        if !sawRequest, let context {
            sawRequest = true
            context.triggerUserOutboundEvent(ConnectionGuard.RequestStarted(), promise: nil)
        }
        // gRPC calls are observed from here (plain HTTP requests are the HTTP handler's).
        if let observer, stream.isGRPCContentType || !keepsRawHeaders {
            stream.startedAt = NIODeadline.now().uptimeNanoseconds | 1  // 0: not observed
            observer.callStarted()
        }
        if stream.headersTooLarge {
            return fail(
                stream,
                RPCError(
                    .resourceExhausted,
                    "request header list exceeds the limit of \(shared.configuration.maxHeaderListSize) bytes"))
        }
        if !stream.isGRPCContentType, keepsRawHeaders {
            stream.isHTTP = true
            swap(&stream.rawHeaders, &headScratch)
            let config = shared.configuration
            stream.httpLimit =
                config.httpHandler?.maxBodyBytes(method: stream.method, path: HTTPRequest.path(of: stream.path))
                ?? config.maxReceiveMessageSize
            guard let handler = config.httpHandler else { return }
            let pairs = stream.rawHeaders.pairs
            stream.httpHeaderPairs = pairs
            let head = HTTPRequest(method: stream.method, target: stream.path, headers: pairs, body: [], peer: peer)
            if stream.method == "CONNECT" {
                // This server tunnels nothing (a CONNECT stream has no end to wait for).
                stream.phase = .done
                respondHTTP(stream, .connectRefused)
            } else if let declared = stream.rawHeaders.contentLength, declared > stream.httpLimit {
                // Refused from its declared length: the body is never read.
                stream.phase = .done
                respondHTTP(stream, handler.bodyTooLarge(head, limit: stream.httpLimit))
            } else if let refusal = handler.respondAtHead(head) {
                // Refused from its head alone: the body is never read either.
                stream.phase = .done
                respondHTTP(stream, refusal)
            }
            return
        }
        guard stream.isGRPCContentType else {
            return respondNonGRPC(
                stream, status: 415,
                message: "invalid content-type '\(stream.contentType)': a gRPC request needs application/grpc")
        }
        guard stream.method == "POST" else {
            return respondNonGRPC(stream, status: 405, message: "gRPC requests use POST, not \(stream.method)")
        }
        // Routed here (it decides what form the metadata takes), refused below in the order
        // the checks always had.
        var routed = route(stream.path)
        var relay: (any UnaryRelay)?
        if case .success(var method) = routed, case .unaryRelay(let r) = method.handler {
            // A relay whose chain has more than its check: a call the rest takes part in runs
            // through the chain, with a context (`GatedRelay`).
            if let path = r.contextPath(method.descriptor, metadataScratch) {
                method.handler = path
                routed = .success(method)
            } else {
                relay = r
            }
        }
        takeMetadata(stream, relayed: relay != nil)
        if let bad = stream.badMetadata { return fail(stream, RPCError(.internal, bad)) }
        if let enc = stream.encoding, enc != "identity", enc != "gzip" {
            return fail(stream, RPCError(.unimplemented, "message encoding '\(enc)' is not supported; use gzip or identity"))
        }
        switch consume routed {
        case .failure(let error):
            return fail(stream, error)
        case .success(let method):
            // What the handler is decides when it starts (the switch in startHandler).
            stream.clientStreams = method.handler.kind.clientStreams
            if let limit = method.descriptor.maxRequestBytes, limit < stream.deframer.maxMessageSize {
                stream.deframer.maxMessageSize = limit
            }
            // Refusals that need nothing but the headers (no credential at all) come now,
            // before a request byte is buffered. A relay's check is the whole chain
            // (`ServerInterceptors.wrap`): it decides from the bytes.
            let refusal =
                if let relay { relay.rejectAtHeaders(method.descriptor, stream.relayMetadata) } else {
                    interceptors.rejectAtHeaders(method.descriptor, stream.metadata)
                }
            stream.target = consume method  // its last use: moved, not copied
            if let refusal { return fail(stream, refusal) }
        }
        if let timeout = stream.timeout {
            guard let d = GRPCTimeout.parse(timeout) else {
                return fail(stream, RPCError(.internal, "malformed grpc-timeout '\(timeout)'"))
            }
            startDeadline(stream, after: d)
        }
        if stream.clientStreams { startHandler(stream) }
    }

    /// The deadline counts from the request headers, for the timer and the handler's context.
    private func startDeadline(_ stream: ServerStream, after d: Duration) {
        guard let context else { return }
        stream.deadline = .now + d
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let id = stream.id
        stream.deadlineTimer = context.eventLoop.scheduleTask(in: TimeAmount(d)) {
            bound.value.deadlineReached(id)
        }
    }

    private func deadlineReached(_ id: Int32) {
        guard let stream = streams[id], stream.phase != .done else { return }
        stream.requestStream?.finish(throwing: RPCError.deadlineExceeded())
        fail(stream, RPCError.deadlineExceeded("deadline exceeded"))
        flush()
    }

    /// A request message is complete. `held`: its bytes still holding the flow-control window;
    /// `charged`: its budget charge. Both are given back when the handler takes the message (or
    /// when the stream ends).
    private func receivedMessage(_ stream: ServerStream, _ frame: MessageDeframer.Frame, held: Int, charged: Int, limit: Int) {
        if stream.awaitingAdmission {
            // It fitted in its window after all: nothing to admit any more.
            endWait(stream)
            budget.cancelWait(stream: stream.id)
        }
        stream.heldBytes += held
        guard stream.target != nil, stream.phase != .done else { return }
        var payload = frame.payload
        if frame.compressed {
            guard stream.encoding == "gzip" else {
                return fail(stream, RPCError(.internal, "compressed message received but the request has no grpc-encoding"))
            }
            do {
                payload = try Gzip.decompress(payload, limit: limit)
            } catch is Gzip.TooLarge {
                return fail(
                    stream, RPCError(.resourceExhausted, "decompressed request message exceeds the limit of \(limit) bytes for \(stream.path)"))
            } catch {
                return fail(stream, RPCError(.internal, "request message is not valid gzip"))
            }
        }
        stream.requestMessages += 1
        stream.requestBytes += frame.payload.count
        let message = RawMessageStream.InboundMessage(bytes: payload, compressed: frame.compressed, wireSize: held)
        if stream.clientStreams {
            // Window opens, and the charge is given back, when the handler reads the message
            // (RawMessageStream.onConsumed).
            stream.messagesYielded += 1
            if charged > 0 { stream.unreadCharges[stream.messagesYielded] = charged }
            stream.requestStream?.yield(message)
        } else {
            if stream.single != nil {
                return fail(stream, RPCError(.unimplemented, "\(stream.path) takes exactly one request message, got more"))
            }
            stream.single = message
        }
    }

    private func inputEnded(_ stream: ServerStream) {
        guard !stream.inputClosed else { return }
        stream.inputClosed = true
        if stream.isHTTP && stream.phase == .receiving { return startHTTP(stream) }
        guard stream.phase == .receiving || stream.phase == .running, stream.target != nil else { return }
        if stream.deframer.hasPartialMessage {
            stream.requestStream?.finish(throwing: RPCError(.internal, "request stream ended inside a message"))
            return fail(stream, RPCError(.internal, "request stream ended inside a message (truncated message)"))
        }
        if stream.clientStreams {
            stream.requestStream?.finish()
        } else {
            guard stream.single != nil else {
                return fail(stream, RPCError(.unimplemented, "\(stream.path) takes exactly one request message, got none"))
            }
            startHandler(stream)
        }
    }

    /// The connection as its calls reach it from their handlers (`StreamOwner`), made on the
    /// first call and dropped at teardown (it refers to the connection).
    private var owner: StreamOwner?

    private func streamOwner(_ context: ChannelHandlerContext) -> StreamOwner { .reuse(&owner, self, on: context.eventLoop) }

    private func relayConnectionMade() -> RelayConnection {
        if let relayConnection { return relayConnection }
        let made = RelayConnection(peerHost: peerHost)
        relayConnection = made
        return made
    }

    /// The single request of a unary or server-streaming call, handed over once: its bytes leave
    /// flow control here; a large one's charge stays until the call ends (`finish`), since the
    /// handler holds the bytes until then (the gateway's relay until the upstream took them).
    private func takeRequest(_ stream: ServerStream) -> [UInt8] {
        defer {
            stream.single = nil
            if stream.heldBytes > 0, let session {
                nghttp2_session_consume(session, stream.id, stream.heldBytes)
                stream.heldBytes = 0
            }
        }
        return stream.single!.bytes
    }

    private func startHandler(_ stream: ServerStream) {
        // The connection's context and executor are not bound here (each binding is a retain
        // per call): read where used.
        guard stream.target != nil, context != nil, executor != nil else { return }
        stream.phase = .running
        if case .unaryRelay(let relay) = stream.target!.handler {
            // Relayed without a context: the relay gets the call's values, and answers through
            // the stream with the upstream's headers and trailers (`RelayResponder`).
            let request = takeRequest(stream)
            stream.owner = streamOwner(context!)
            stream.cancellation = relay.relay(
                request, stream.target!.descriptor, stream.relayMetadata, deadline: stream.deadline, relayConnectionMade(), stream)
            // The relay has passed the bytes on (nghttp2 copied them): their storage is the next
            // relayed call's on this loop (a relay that kept them costs this a new buffer, not a
            // wrong byte). A burst of calls needs a buffer each (a client sends the headers of all
            // its calls before their bodies), hence a few dozen; none of more than 4 KiB.
            let scratch = loopScratch
            if !stream.relayMetadata.isEmpty && scratch.spareMetadata.count < LoopScratch.maxSpareMetadata
                && stream.relayMetadata.storage.capacity <= LoopScratch.maxSpareMetadataBytes
            {
                stream.relayMetadata.removeAll()
                scratch.spareMetadata.append(stream.relayMetadata)
                stream.relayMetadata = MetadataBytes()
            }
            return
        }
        let requestCompressed = stream.single?.compressed ?? false
        let callContext = ServerContext(
            method: stream.target!.descriptor, requestMetadata: stream.metadata, deadline: stream.deadline, peer: peer, peerHost: peerHost,
            authority: stream.authority, requestCompressed: requestCompressed,
            compressResponses: stream.encoding == "gzip", executor: executor)
        stream.context = callContext
        let owner = streamOwner(context!)
        let id = stream.id

        /// Runs `work` (the interceptors' chain and the handler: `Router` wrapped it) in the
        /// call's task, and reports the outcome on the loop (a streaming call's responses went
        /// out through its sink; only the status is left).
        func runTask(streaming: Bool, _ work: @escaping @Sendable () async throws -> [UInt8]) {
            stream.task = Task(executorPreference: executor) {
                let result: Result<[UInt8], any Error>
                do {
                    result = .success(try await work())
                } catch {
                    result = .failure(error)
                }
                owner.loop.runOnLoop { owner.handler.value.complete(id, response: result, streaming: streaming) }
            }
        }
        func takeSingle() -> [UInt8] { takeRequest(stream) }

        /// A forwarding handler answers through the stream itself (`UnaryResponder`,
        /// `ResponseForwarder`) from the connection's loop; its interceptors run there too, and
        /// start a task only when one cannot decide at once (`ServerInterceptor.interceptForwarded`).
        func forwardWithoutTask(_ start: () -> (any Cancellable)?) {
            stream.owner = owner
            stream.cancellation = start()
        }

        switch stream.target!.handler {
        case .unary(let body):
            let request = takeSingle()
            runTask(streaming: false) { try await body(request, callContext) }
        case .unaryForwarding(let body):
            let request = takeSingle()
            forwardWithoutTask { body(request, callContext, stream) }
        case .unaryRelay:
            preconditionFailure("started above")
        case .serverStreamingForwarding(let body):
            let request = takeSingle()
            forwardWithoutTask { body(request, callContext, stream) }
        case .serverStreaming(let body):
            let request = takeSingle()
            let sink = StreamSink(handler: owner.handler, loop: owner.loop, streamID: id)
            runTask(streaming: true) {
                try await body(request, sink, callContext); return []
            }
        case .clientStreaming(let body):
            let requests = makeRequestStream(stream, bound: owner.handler, loop: owner.loop)
            runTask(streaming: false) { try await body(requests, callContext) }
        case .bidirectionalStreaming(let body):
            let requests = makeRequestStream(stream, bound: owner.handler, loop: owner.loop)
            let sink = StreamSink(handler: owner.handler, loop: owner.loop, streamID: id)
            runTask(streaming: true) {
                try await body(requests, sink, callContext); return []
            }
        }
    }

    private func makeRequestStream(
        _ stream: ServerStream, bound: NIOLoopBound<ServerConnectionHandler>,
        loop: any EventLoop
    ) -> RawMessageStream {
        let id = stream.id
        let requests = RawMessageStream(onConsumed: { bytes in
            loop.runOnLoop {
                let handler = bound.value
                // A closed stream already gave its held bytes back (onStreamClose).
                guard let session = handler.session, let s = handler.streams[id] else { return }
                let n = min(bytes, s.heldBytes)
                s.heldBytes -= n
                if n > 0 { nghttp2_session_consume(session, id, n) }
                // Messages are read in the order they were queued.
                s.messagesRead += 1
                if !s.unreadCharges.isEmpty, let charge = s.unreadCharges.removeValue(forKey: s.messagesRead) {
                    handler.releaseCharge(s, charge)
                }
                handler.scheduleFlush()
            }
        })
        stream.requestStream = requests
        return requests
    }

    /// The handler returned or threw.
    func complete(_ id: Int32, response: Result<[UInt8], any Error>, streaming: Bool = false) {
        guard let stream = streams[id], stream.phase == .running else { return }
        switch response {
        case .success(let bytes):
            if !streaming { enqueue(stream, message: bytes, compress: nil) }
            finish(stream, RPCError(.ok, ""))
        case .failure(let error):
            finish(stream, failure: error)
        }
        scheduleFlush()
    }

    /// Ends a call with its handler's error: an `RPCError` as it is (logged when it hides a
    /// cause), a cancellation as CANCELLED, anything else as INTERNAL (logged, never sent).
    private func finish(_ stream: ServerStream, failure error: any Error) {
        if let rpc = error as? RPCError {
            if let cause = rpc.cause, rpc.code == .internal || rpc.code == .unknown || rpc.code == .dataLoss {
                shared.logger.error("handler \(stream.path) failed: \(rpc.message): \(cause)")
            }
            finish(stream, rpc)
        } else if error is CancellationError {
            finish(stream, RPCError.cancelled("the call was cancelled"))
        } else {
            shared.logger.error("handler \(stream.path) failed: \(error)")
            finish(stream, RPCError(.internal, "internal error"))
        }
    }

    /// A relayed call's answer (`RawHandler.unaryRelay`): the upstream's headers and trailers
    /// are the call's own; the response is compressed as the request was (as a context starts).
    func completeRelayed(_ id: Int32, _ result: Result<[UInt8], any Error>, headers: Metadata, trailers: Metadata) {
        guard let stream = streams[id], stream.phase == .running else { return }
        if headers.count > 0 { stream.relayedHeaders = headers }
        if trailers.count > 0 { stream.relayedTrailers = trailers }
        switch result {
        case .success(let bytes):
            enqueue(stream, message: bytes, compress: stream.encoding != nil && stream.encoding == "gzip")
            finishOK(stream)
        case .failure(let error):
            finish(stream, failure: error)
        }
        scheduleFlush()
    }

    /// Ends a call with an error from the transport itself (before or during the handler).
    private func fail(_ stream: ServerStream, _ error: RPCError) {
        guard stream.phase != .done else { return }
        let wasRunning = stream.phase == .running
        // Answer first: a forwarding handler's cancellation completes the call synchronously,
        // and its CANCELLED must not win over this error.
        finish(stream, error)
        if wasRunning { stream.cancelHandler() }
    }

    /// Sends the status: Trailers-Only when no headers went out, else trailers after the data.
    private func finish(_ stream: ServerStream, _ status: RPCError) {
        guard let session, stream.phase != .done else { return }
        closeCall(stream)
        let contextTrailers = stream.context?.trailers ?? stream.relayedTrailers
        if status.code == .ok, status.message.isEmpty, status.details == nil, status.trailers.count == 0,
            endsPlainly(stream, contextTrailers)
        {
            return endOK(stream)
        }
        var trailers = stream.headersSent ? takeBlock() : responseHeaderBlock(stream, gzip: false)
        trailers.add("grpc-status", String(status.code.rawValue))
        if !status.message.isEmpty { trailers.add("grpc-message", PercentEncoding.encode(status.message)) }
        if let details = status.details { trailers.add("grpc-status-details-bin", Base64.encode(details)) }
        trailers.add(metadata: contextTrailers)
        trailers.add(metadata: status.trailers)
        if stream.headersSent {
            stream.trailers = trailers
            resumeData(stream)
        } else {
            stream.headersSent = true
            _ = trailers.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, nil) }
            recycle(trailers)
        }
        ended(stream, status.code)
    }

    /// `finish(stream, RPCError(.ok, ""))` without making the error: a relayed call's usual end.
    private func finishOK(_ stream: ServerStream) {
        guard session != nil, stream.phase != .done, endsPlainly(stream, stream.context?.trailers ?? stream.relayedTrailers) else {
            return finish(stream, RPCError(.ok, ""))
        }
        closeCall(stream)
        endOK(stream)
    }

    /// Whether an OK status with no message, details or trailers of its own ends `stream` with
    /// the usual trailer bytes (`endOK`): its headers went out, and nothing else adds trailers.
    @inline(__always)
    private func endsPlainly(_ stream: ServerStream, _ contextTrailers: Metadata) -> Bool {
        stream.headersSent && contextTrailers.count == 0
    }

    /// The first steps of a call's end: it is done, and its large messages leave the budgets
    /// (their window bytes are given back when the stream stops reading: after the current feed,
    /// or when it closes).
    @inline(__always)
    private func closeCall(_ stream: ServerStream) {
        stream.phase = .done
        if stream.charged > 0 || stream.awaitingAdmission { releaseCharges(stream) }
        stream.deadlineTimer?.cancel()
        stream.deadlineTimer = nil
    }

    /// The usual end of a call (OK, no message, no trailers of its own, headers sent): the same
    /// trailer bytes every time.
    private func endOK(_ stream: ServerStream) {
        stream.trailers = okTrailers
        resumeData(stream)
        ended(stream, .ok)
    }

    /// What follows a call's status, however it was sent.
    private func ended(_ stream: ServerStream, _ code: StatusCode) {
        if !stream.inputClosed {
            // The client may still be sending; it can stop now (gRPC servers send RST NO_ERROR).
            stream.requestStream?.finish()
        }
        for w in stream.takeWriters().waiters { w.resume(throwing: RPCError.cancelled("the call has ended")) }
        observeEnd(stream, code)
    }

    /// Reports an observed call's end once (a call is observed from its accepted headers on).
    private func observeEnd(_ stream: ServerStream, _ code: StatusCode) {
        let started = stream.startedAt
        guard started != 0, let observer else { return }
        stream.startedAt = 0
        let nanoseconds = Int(truncatingIfNeeded: NIODeadline.now().uptimeNanoseconds &- started)
        guard observerReadsDetails else {
            // Metrics: the counted fields alone, no record made.
            return observer.callEnded(
                method: stream.target?.descriptor, code: code, nanoseconds: nanoseconds, requestMessages: stream.requestMessages,
                requestBytes: stream.requestBytes, responseMessages: stream.responseMessages, responseBytes: stream.responseBytes)
        }
        observer.callEnded(
            ServerCallRecord(
                method: stream.target?.descriptor, code: code, nanoseconds: nanoseconds,
                requestMessages: stream.requestMessages, requestBytes: stream.requestBytes,
                responseMessages: stream.responseMessages, responseBytes: stream.responseBytes, peer: peer,
                context: stream.context))
    }

    private func startHTTP(_ stream: ServerStream) {
        guard let handler = shared.configuration.httpHandler, let context, let executor else { return }
        stream.phase = .running
        let request = HTTPRequest(
            method: stream.method, target: stream.path, headers: stream.httpHeaderPairs ?? stream.rawHeaders.pairs,
            body: stream.httpBody, peer: peer)
        stream.httpBody = []
        if stream.httpCharged > 0 {
            shared.configuration.requestBudget.release(stream.httpCharged)
            stream.httpCharged = 0
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loop = context.eventLoop
        let id = stream.id
        // Without a task when the handler can (a relayed unary call): it answers from a callback.
        let cancellation = CallCancellation()
        stream.cancellation = cancellation
        let immediate = handler.handleImmediately(request, cancellation: cancellation) { response in
            loop.runOnLoop {
                let h = bound.value
                guard let s = h.streams[id], s.phase == .running else { return }
                s.phase = .done
                s.cancellation = nil
                h.respondHTTP(s, response)
                h.scheduleFlush()
            }
        }
        if immediate { return }
        stream.cancellation = nil
        stream.task = Task(executorPreference: executor) {
            let response = await handler.handle(request)
            guard let body = response.stream else {
                loop.runOnLoop {
                    let h = bound.value
                    guard let s = h.streams[id], s.phase == .running else { return }
                    s.phase = .done
                    h.respondHTTP(s, response)
                    h.scheduleFlush()
                }
                return
            }
            // A streamed body: the head now, then DATA frames as the body is written; the
            // stream stays `.running` meanwhile, so a client that goes cancels this task.
            let started = await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
                loop.runOnLoop {
                    let h = bound.value
                    guard let s = h.streams[id], s.phase == .running else { return c.resume(returning: false) }
                    h.respondHTTPStreamHead(s, response)
                    if h.shuttingDown { s.cancelHandler() }  // the drain began while it waited for its head
                    h.scheduleFlush()
                    c.resume(returning: true)
                }
            }
            // Called even when the client went before the head: the body's writer then fails at
            // once, so whatever the handler started for it is ended by the body, not leaked.
            try? await body(HTTP2BodyWriter(handler: bound, loop: loop, streamID: id))
            guard started else { return }
            loop.runOnLoop {
                let h = bound.value
                guard let s = h.streams[id], s.phase == .running else { return }
                s.phase = .done
                s.httpComplete = true
                h.resumeData(s)
                h.scheduleFlush()
            }
        }
    }

    /// The head of a streamed HTTP response; its DATA frames follow as the body is written
    /// (`HTTP2BodyWriter`), the last with END_STREAM once `httpComplete` is set.
    func respondHTTPStreamHead(_ stream: ServerStream, _ response: HTTPResponse) {
        guard let session else { return }
        stream.headersSent = true
        var block = HeaderBlock()
        block.add(":status", String(response.status))
        for (n, v) in response.headers where HeaderBlock.isValidName(n) && n != "content-length" {
            block.add(n, HeaderBlock.sanitize(v))
        }
        stream.trailers = nil
        stream.httpComplete = false
        var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: serverReadData)
        _ = block.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, &provider) }
    }

    /// Queues bytes of a streamed HTTP body. Returns false when the buffered bytes are over the
    /// limit and the writer should wait.
    func enqueueHTTP(_ stream: ServerStream, _ bytes: [UInt8]) -> Bool {
        stream.outbound.writeBytes(bytes)
        resumeData(stream)
        return stream.outbound.readableBytes <= shared.configuration.maxBufferedResponseBytes
    }

    func respondHTTP(_ stream: ServerStream, _ response: HTTPResponse) {
        guard let session else { return }
        stream.headersSent = true
        var block = HeaderBlock()
        block.add(":status", String(response.status))
        for (n, v) in response.headers where HeaderBlock.isValidName(n) { block.add(n, HeaderBlock.sanitize(v)) }
        block.add("content-length", String(response.body.count))
        let bodiless = response.body.isEmpty || stream.method == "HEAD"
        if bodiless && stream.inputClosed {
            _ = block.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, nil) }
            return
        }
        // An answer before the request's end ends with a DATA frame even when empty: the
        // RST_STREAM that follows it must not overtake the HEADERS (`readData`).
        if !bodiless { stream.outbound.writeBytes(response.body) }
        stream.trailers = nil
        stream.httpComplete = true
        var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: serverReadData)
        _ = block.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, &provider) }
    }

    /// An answer complete before the request's end (refused from its head, a body over its
    /// limit): RST_STREAM(NO_ERROR) asks the client to stop sending the rest without error
    /// (RFC 9113 §8.1; nginx, httpd and Kestrel do the same), instead of sending its whole body
    /// for nothing. Submitted as the answer's last DATA frame is read (`readData`): one submitted
    /// beside the HEADERS goes out before them. A small declared body (64 KiB at most, what the
    /// windows take anyway) is read and dropped instead: some clients (curl 7.88) report a
    /// reset stream as a failure even after a whole answer.
    private func stopRequestAfterAnswer(_ session: OpaquePointer, _ stream: ServerStream) {
        guard !stream.inputClosed, stream.rawHeaders.contentLength.map({ $0 > 64 * 1024 }) ?? true else { return }
        stream.inputClosed = true
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream.id, NGHTTP2_NO_ERROR.rawValue)
    }

    private func respondNonGRPC(_ stream: ServerStream, status: Int, message: String) {
        guard let session else { return }
        stream.phase = .done
        stream.headersSent = true
        var block = HeaderBlock()
        block.add(":status", String(status))
        block.add("content-type", "application/grpc")
        block.add("grpc-status", String(StatusCode.internal.rawValue))
        block.add("grpc-message", PercentEncoding.encode(message))
        _ = block.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, nil) }
        observeEnd(stream, .internal)
    }

    /// The response headers: `grpc-encoding: gzip` among them when `gzip` (the messages that
    /// follow may then be compressed; without it none is).
    private func responseHeaderBlock(_ stream: ServerStream, gzip: Bool) -> HeaderBlock {
        var block = takeBlock()
        block.append(gzip ? gzipResponseHead : responseHead)
        if let ctx = stream.context {
            block.add(metadata: ctx.initialMetadata)
        } else if stream.relayedHeaders.count > 0 {
            block.add(metadata: stream.relayedHeaders)
        }
        return block
    }

    /// The response headers every gRPC call starts with, built once per connection (its metadata
    /// follows), and the usual trailers below: each connection has its own, so that the calls of
    /// both event loops do not all retain one shared array (its reference count's cache line would
    /// move between the cores on every call). The gzip head too: every call that compresses its
    /// responses for a client that accepts gzip gets it.
    private lazy var responseHead = Self.head(gzip: false)
    private lazy var gzipResponseHead = Self.head(gzip: true)
    private static func head(gzip: Bool) -> HeaderBlock {
        var block = HeaderBlock()
        block.add(":status", "200")
        block.add("content-type", "application/grpc")
        if gzip { block.add("grpc-encoding", "gzip") }
        block.add("grpc-accept-encoding", "gzip,identity")
        return block
    }
    /// The trailers of a call that ended OK with no trailing metadata (shared by the connection's
    /// calls: never recycled).
    private lazy var okTrailers: HeaderBlock = {
        var block = HeaderBlock()
        block.add("grpc-status", "0")
        block.isShared = true
        return block
    }()

    /// Sends the response headers unless they went out. They declare gzip only when the client
    /// accepts it and the call compresses its responses as they go out (`compressing`, or the
    /// context's setting now): a client that accepts gzip gets one header fewer on every call
    /// that does not compress (nearly all: every gRPC library accepts gzip, the gateway too),
    /// and a response compressed later in a stream whose headers said nothing goes uncompressed.
    func sendHeadersIfNeeded(_ stream: ServerStream, compressing: Bool? = nil) {
        guard !stream.headersSent, let session else { return }
        stream.headersSent = true
        stream.responseGzip = stream.clientAcceptsGzip && (compressing ?? stream.context?.compressResponses ?? false)
        let block = responseHeaderBlock(stream, gzip: stream.responseGzip)
        var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: serverReadData)
        _ = block.withNV { nva, n in nghttp2_submit_response(session, stream.id, nva, n, &provider) }
        recycle(block)
    }

    // MARK: Forwarded responses (ServerStream's ResponseForwarder, on the loop)

    func forwardHeaders(_ stream: ServerStream) {
        guard stream.phase == .running else { return }
        sendHeadersIfNeeded(stream)
        scheduleFlush()
    }

    /// False when the queued bytes are past the limit (the message is queued all the same).
    func forward(_ stream: ServerStream, _ message: [UInt8]) -> Bool {
        // A call already over takes nothing more; its source is being stopped.
        guard stream.phase == .running else { return true }
        let room = enqueue(stream, message: message, compress: nil)
        scheduleFlush()
        return room
    }

    func whenWritable(_ stream: ServerStream, _ body: @escaping @Sendable () -> Void) {
        guard stream.phase == .running else { return }
        if stream.outbound.readableBytes <= shared.configuration.maxBufferedResponseBytes { return body() }
        stream.writableCallbacks.append(body)
    }

    /// Queues one response message (framed, compressed when agreed). Returns false when the
    /// buffered bytes are over the limit and the writer should wait.
    @discardableResult
    func enqueue(_ stream: ServerStream, message: [UInt8], compress: Bool?) -> Bool {
        let wantsCompression = compress ?? stream.context?.compressResponses ?? false
        sendHeadersIfNeeded(stream, compressing: wantsCompression)
        stream.responseMessages += 1
        stream.responseBytes += message.count
        let compressed = wantsCompression && stream.responseGzip
        stream.outbound.writeMessage(message, compress: compressed)
        resumeData(stream)
        return stream.outbound.readableBytes <= shared.configuration.maxBufferedResponseBytes
    }

    private func resumeData(_ stream: ServerStream) {
        if stream.dataDeferred, let session {
            stream.dataDeferred = false
            nghttp2_session_resume_data(session, stream.id)
        }
    }

    /// nghttp2 pulls response bytes for DATA frames.
    func readData(
        _ streamID: Int32, _ buf: UnsafeMutablePointer<UInt8>, _ length: Int,
        _ flags: UnsafeMutablePointer<UInt32>
    ) -> Int {
        guard let session else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        return withStream(streamID) { readData(session, $0, buf, length, flags) } ?? Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }

    private func readData(
        _ session: OpaquePointer, _ stream: ServerStream, _ buf: UnsafeMutablePointer<UInt8>, _ length: Int,
        _ flags: UnsafeMutablePointer<UInt32>
    ) -> Int {
        let streamID = stream.id
        let n = stream.outbound.read(into: buf, max: length)
        if n > 0 {
            if stream.streamingPart != nil, stream.outbound.readableBytes <= shared.configuration.maxBufferedResponseBytes {
                let (waiters, callbacks) = stream.takeWriters()
                for w in waiters { w.resume() }
                for c in callbacks { c() }
            }
        }
        if stream.outbound.readableBytes == 0, let trailers = stream.trailers {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue | NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
            stream.trailers = nil
            _ = trailers.withNV { nva, count in nghttp2_submit_trailer(session, streamID, nva, count) }
            recycle(trailers)
            return n
        }
        if stream.outbound.readableBytes == 0 && stream.httpComplete {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            // Queued after this last DATA frame.
            stopRequestAfterAnswer(session, stream)
            return n
        }
        if n == 0 {
            stream.dataDeferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        return n
    }

    static func describe(_ address: SocketAddress) -> String {
        if let ip = address.ipAddress, let port = address.port {
            return address.protocol == .inet6 ? "[\(ip)]:\(port)" : "\(ip):\(port)"
        }
        return "\(address)"
    }
}

/// The streaming-response sink handlers write to; hops to the connection's loop.
struct StreamSink: ServerResponseSink {
    let handler: NIOLoopBound<ServerConnectionHandler>
    let loop: any EventLoop
    let streamID: Int32

    func sendInitialMetadata() async throws {
        let (handler, id) = (self.handler, streamID)
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
            loop.runOnLoop {
                let h = handler.value
                guard let stream = h.streams[id], stream.phase == .running else {
                    return c.resume(throwing: RPCError.cancelled("the call has ended"))
                }
                h.sendHeadersIfNeeded(stream)
                h.scheduleFlush()
                c.resume()
            }
        }
    }

    func write(_ message: [UInt8], compress: Bool?) async throws {
        let (handler, id) = (self.handler, streamID)
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
            loop.runOnLoop {
                let h = handler.value
                guard let stream = h.streams[id], stream.phase == .running else {
                    return c.resume(throwing: RPCError.cancelled("the call has ended"))
                }
                if h.enqueue(stream, message: message, compress: compress) {
                    c.resume()
                } else {
                    stream.writeWaiters.append(c)
                }
                h.scheduleFlush()
            }
        }
    }
}

/// A streamed HTTP response body over HTTP/2 (`HTTPResponse.stream`); hops to the connection's loop.
struct HTTP2BodyWriter: HTTPBodyWriter {
    let handler: NIOLoopBound<ServerConnectionHandler>
    let loop: any EventLoop
    let streamID: Int32

    func write(_ bytes: [UInt8]) async throws {
        let (handler, id) = (self.handler, streamID)
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
            loop.runOnLoop {
                let h = handler.value
                guard let stream = h.streams[id], stream.phase == .running else {
                    return c.resume(throwing: RPCError.cancelled("the client has gone"))
                }
                if h.enqueueHTTP(stream, bytes) {
                    c.resume()
                } else {
                    stream.writeWaiters.append(c)
                }
                h.scheduleFlush()
            }
        }
    }
}

// MARK: C callbacks → the handler (user_data is the unretained handler)

/// Calls `body` with the connection nghttp2 calls back for, without a retain and release per
/// callback (several per call): nghttp2 calls back only from inside the connection's own calls
/// (mem_recv, mem_send, submit), while the connection is alive.
@inline(__always)
private func handler<R>(_ p: UnsafeMutableRawPointer?, _ body: (ServerConnectionHandler) -> R) -> R {
    Unmanaged<ServerConnectionHandler>.fromOpaque(p!)._withUnsafeGuaranteedRef(body)
}

private let serverOnBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, user in
    handler(user) { $0.onBeginHeaders(frame!) }
}
private let serverOnHeader: nghttp2_on_header_callback = { _, frame, name, nameLen, value, valueLen, _, user in
    handler(user) { $0.onHeader(frame!, name!, nameLen, value!, valueLen) }
}
private let serverOnFrameRecv: nghttp2_on_frame_recv_callback = { _, frame, user in
    handler(user) { $0.onFrameRecv(frame!) }
}
private let serverOnDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, len, user in
    handler(user) { $0.onDataChunk(streamID, data!, len) }
}
private let serverOnStreamClose: nghttp2_on_stream_close_callback = { _, streamID, code, user in
    handler(user) { $0.onStreamClose(streamID, code) }
}
private let serverReadData: nghttp2_data_source_read_callback = { _, streamID, buf, length, flags, _, user in
    handler(user) { $0.readData(streamID, buf!, length, flags!) }
}
