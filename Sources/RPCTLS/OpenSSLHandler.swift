import COpenSSL
import Logging
import NIOCore

/// TLS 1.2/1.3 for a NIO channel, done by OpenSSL, for either role (the configuration says which).
///
/// Place it first in the pipeline (nearest the socket): ciphertext `ByteBuffer`s come in from the
/// socket and go out to it; plaintext `ByteBuffer`s go to and come from the handlers after it.
///
/// ## Why memory BIOs
/// OpenSSL never touches the socket. The `SSL*` reads ciphertext from one memory BIO, which this
/// handler fills from `channelRead`, and writes ciphertext to another, which this handler drains into
/// `ByteBuffer`s it writes to the channel. So every byte of I/O, every wait and every timer stays on
/// the channel's event loop under NIO's control (back-pressure, half-closure, fairness with the other
/// connections on the loop), and OpenSSL is a pure state machine that never blocks. Its "would block"
/// answers (`SSL_ERROR_WANT_READ`) just mean "no more bytes buffered yet".
///
/// ## One owner per `SSL*`
/// An `SSL*` is not thread-safe. Each handler creates its own in `handlerAdded`, uses it only from
/// its channel's event loop, and frees it (with both BIOs, which it owns) in `handlerRemoved`, so the
/// handle has exactly one owner and one thread. The shared, immutable `SSL_CTX` lives in
/// `TLSConfiguration`, which this handler retains.
///
/// ## Events and ordering
/// - The client starts the handshake when the channel becomes active; the server when the first
///   bytes arrive.
/// - When the handshake finishes it fires ``TLSHandshakeCompleted`` with the ALPN protocol, then
///   sends the writes that were issued (and flushed) before it, then delivers any application data
///   that arrived with the last handshake flight.
/// - Writes are queued until `flush`, then encrypted together and written as few ciphertext buffers
///   as possible; each write's promise completes when the ciphertext carrying it has been written.
/// - `close` sends `close_notify` before closing the socket; `close(mode: .output)` sends it and
///   half-closes. A received `close_notify` becomes `ChannelEvent.inputClosed` when the channel allows
///   remote half-closure, and closes the channel otherwise.
/// - Any TLS failure fires a ``TLSError`` through `errorCaught`, sends the alert OpenSSL produced,
///   and closes the channel.
///
/// Not `Sendable`: like every channel handler it belongs to its channel's event loop.
public final class OpenSSLHandler: ChannelDuplexHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    enum State {
        /// Added; waiting for channelActive (client) or the first bytes (server).
        case idle
        case handshaking
        case active
        /// `close(mode: .all)` sent `close_notify`; the socket closes when that write completes.
        case closing
        /// Failed, closed or inactive: no further TLS work.
        case closed
    }

    struct PendingWrite {
        var data: ByteBuffer
        var promise: EventLoopPromise<Void>?
    }

    /// The ALPN protocol agreed in the handshake (`nil` before it finishes or when none was agreed).
    /// Read it on the channel's event loop.
    public private(set) var negotiatedProtocol: String?
    /// The negotiated protocol version, such as `"TLSv1.3"`, once the handshake has finished.
    public private(set) var protocolVersion: String?

    let configuration: TLSConfiguration
    private let serverName: String?
    private let shutdownTimeout: TimeAmount
    private let handshakeTimeout: TimeAmount?
    private var handshakeDeadline: Scheduled<Void>?
    private let logger: Logger

    var state: State = .idle
    /// Owned; `nil` before `handlerAdded` and after `handlerRemoved`.
    private var ssl: OpaquePointer?
    /// Owned by `ssl` (SSL_set_bio transfers both); kept only to feed and drain them.
    private var readBIO: OpaquePointer?
    private var writeBIO: OpaquePointer?

    /// Plaintext writes not yet encrypted; the first `flushedCount` of them have been flushed.
    private var pendingWrites = CircularBuffer<PendingWrite>(initialCapacity: 4)
    private var flushedCount = 0
    /// Reused buffers: `clear()` recycles the storage when the consumer let go of it, and allocates
    /// fresh storage (without copying) when it did not.
    private var plaintextBuffer: ByteBuffer?
    private var ciphertextBuffer: ByteBuffer?

    private var sentCloseNotify = false
    private var receivedCloseNotify = false
    private var closeForwarded = false
    private var readPending = false
    private var firedPlaintext = false

    /// Encrypt at most this much plaintext per SSL_write, so the write BIO stays small and is drained
    /// into a `ByteBuffer` as we go rather than growing to the size of a large write.
    static let writeChunk = 64 * 1024
    /// Hand a ciphertext buffer to the channel once it reaches this size during a large flush.
    static let ciphertextBatch = 256 * 1024
    /// A record carries at most 16 KiB of plaintext; SSL_read gets at least that much room.
    static let readChunk = 16 * 1024

    private static let defaultLogger = Logger(label: "rpc.tls")

    /// - Parameters:
    ///   - configuration: the shared context: role, certificates, trust and ALPN.
    ///   - serverName: for a client, overrides `configuration.serverName` for this connection (SNI and
    ///     the name the certificate must match). Ignored by servers.
    ///   - handshakeTimeout: how long after the connection becomes active the handshake may take
    ///     before the connection is failed with `TLSError.Kind.handshakeTimeout` and closed,
    ///     so a peer that connects and stalls cannot hold a connection (and an `SSL*`) forever.
    ///     `nil` disables it.
    ///   - shutdownTimeout: how long `close` waits for `close_notify` to be written before closing
    ///     the socket anyway (a peer that stopped reading must not keep the connection open).
    ///   - logger: debug-level handshake traces.
    public init(
        configuration: TLSConfiguration, serverName: String? = nil, handshakeTimeout: TimeAmount? = .seconds(10),
        shutdownTimeout: TimeAmount = .seconds(5), logger: Logger? = nil
    ) {
        self.handshakeTimeout = handshakeTimeout
        self.configuration = configuration
        self.serverName = serverName ?? configuration.serverName
        self.shutdownTimeout = shutdownTimeout
        self.logger = logger ?? Self.defaultLogger
    }

    deinit {
        // Normally already freed in handlerRemoved; this covers a handler that was never added.
        if let ssl { SSL_free(ssl); configuration.liveSessions.wrappingSubtract(1, ordering: .relaxed) }
    }

    // MARK: Lifecycle

    public func handlerAdded(context: ChannelHandlerContext) {
        do {
            try makeSession()
        } catch {
            state = .closed
            context.fireErrorCaught(error)
            forwardClose(context: context, promise: nil)
            return
        }
        if context.channel.isActive {
            armHandshakeTimeout(context: context)
            if configuration.role == .client { startHandshake(context: context) }
        }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        state = .closed
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
        failPendingWrites(ChannelError.ioOnClosedChannel)
        freeSession()
    }

    public func channelActive(context: ChannelHandlerContext) {
        armHandshakeTimeout(context: context)
        if configuration.role == .client, state == .idle { startHandshake(context: context) }
        context.fireChannelActive()
        // With autoRead off nobody else asks for the handshake's bytes.
        if state == .idle || state == .handshaking { context.read() }
    }

    public func channelInactive(context: ChannelHandlerContext) {
        let wasHandshaking = state == .handshaking
        state = .closed
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
        if wasHandshaking {
            let error = TLSError(.closedDuringHandshake, "the connection closed before the handshake finished")
            failPendingWrites(error)
            context.fireErrorCaught(error)
        } else {
            failPendingWrites(ChannelError.ioOnClosedChannel)
        }
        context.fireChannelInactive()
    }

    // MARK: Inbound

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let readBIO, state != .closed else { return }
        let bytes = unwrapInboundIn(data)
        let fed = bytes.withUnsafeReadableBytes { BIO_write(readBIO, $0.baseAddress, Int32(clamping: $0.count)) }
        if fed < bytes.readableBytes {
            fail(context: context, TLSError(.protocolError, "cannot buffer \(bytes.readableBytes) received bytes"))
            return
        }
        switch state {
        case .idle:
            state = .handshaking
            doHandshake(context: context)
        case .handshaking:
            doHandshake(context: context)
        case .active, .closing:
            readPlaintext(context: context)
            // An SSL_write that needed to read first (not expected: renegotiation is off) retries here.
            if state == .active, flushedCount > 0 { encryptFlushedWrites(context: context) }
        case .closed:
            break
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        let delivered = firedPlaintext
        firedPlaintext = false
        if delivered { readPending = false }
        context.fireChannelReadComplete()
        // A read that produced no plaintext (a partial record, a handshake flight, a session ticket)
        // must not leave a handler that reads on demand (autoRead off) waiting forever.
        if state == .handshaking || (readPending && !delivered && (state == .active)) { context.read() }
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            switch state {
            case .handshaking:
                fail(context: context, TLSError(.closedDuringHandshake, "the peer closed its side during the handshake"))
            case .active, .closing:
                // After close_notify we already told the pipeline; a bare TCP FIN without close_notify
                // is passed on (the protocol above decides whether its framing was complete).
                if !receivedCloseNotify { context.fireUserInboundEventTriggered(event) }
            case .idle, .closed:
                context.fireUserInboundEventTriggered(event)
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    // MARK: Outbound

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch state {
        case .closing, .closed:
            promise?.fail(ChannelError.ioOnClosedChannel)
        case .idle, .handshaking, .active:
            if sentCloseNotify {
                promise?.fail(ChannelError.outputClosed)
            } else {
                pendingWrites.append(PendingWrite(data: unwrapOutboundIn(data), promise: promise))
            }
        }
    }

    public func flush(context: ChannelHandlerContext) {
        flushedCount = pendingWrites.count
        // Before the handshake finishes, flushed writes wait; handshakeCompleted sends them.
        if state == .active { encryptFlushedWrites(context: context) }
    }

    public func read(context: ChannelHandlerContext) {
        readPending = true
        context.read()
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        switch mode {
        case .input:
            context.close(mode: .input, promise: promise)
        case .output:
            guard state == .active, !sentCloseNotify else {
                // Before the handshake there is nothing to close cleanly, and queued writes can no
                // longer be sent.
                if state != .active { failPendingWrites(ChannelError.outputClosed) }
                context.close(mode: .output, promise: promise)
                return
            }
            failPendingWrites(ChannelError.outputClosed)
            let written = sendCloseNotify(context: context)
            written.assumeIsolated().whenComplete { _ in context.close(mode: .output, promise: promise) }
        case .all:
            switch state {
            case .active:
                state = .closing
                failPendingWrites(ChannelError.ioOnClosedChannel)
                if sentCloseNotify {
                    forwardClose(context: context, promise: promise)
                } else {
                    closeAfterCloseNotify(context: context, promise: promise)
                }
            case .closing:
                if let promise { context.channel.closeFuture.cascade(to: promise) }
            case .idle, .handshaking, .closed:
                state = .closed
                failPendingWrites(ChannelError.ioOnClosedChannel)
                forwardClose(context: context, promise: promise)
            }
        }
    }
}

@available(*, unavailable)
extension OpenSSLHandler: Sendable {}

// MARK: - Session

extension OpenSSLHandler {
    private func makeSession() throws {
        ERR_clear_error()
        guard let ssl = SSL_new(configuration.context) else { throw TLSError.configuration("SSL_new failed") }
        guard let rbio = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw TLSError.configuration("BIO_new failed")
        }
        guard let wbio = BIO_new(BIO_s_mem()) else {
            BIO_free(rbio)
            SSL_free(ssl)
            throw TLSError.configuration("BIO_new failed")
        }
        // An empty read BIO means "wait for more bytes" (retry), never end of stream: the end of the
        // stream is the socket's business, reported to us as channel events.
        copenssl_bio_set_mem_eof_return(rbio, -1)
        copenssl_bio_set_mem_eof_return(wbio, -1)
        SSL_set_bio(ssl, rbio, wbio)
        self.ssl = ssl
        self.readBIO = rbio
        self.writeBIO = wbio
        configuration.liveSessions.wrappingAdd(1, ordering: .relaxed)

        switch configuration.role {
        case .server:
            SSL_set_accept_state(ssl)
        case .client:
            SSL_set_connect_state(ssl)
            if let name = serverName { try configureServerName(ssl, name) }
        }
    }

    private func configureServerName(_ ssl: OpaquePointer, _ name: String) throws {
        let isIPAddress: Bool
        if let parsed = a2i_IPADDRESS(name) {
            ASN1_OCTET_STRING_free(parsed)
            isIPAddress = true
        } else {
            ERR_clear_error()
            isIPAddress = false
        }
        // RFC 6066: SNI carries host names only, never address literals.
        if !isIPAddress, copenssl_set_tlsext_host_name(ssl, name) != 1 {
            throw TLSError.configuration("invalid server name \(name.debugDescription)")
        }
        guard configuration.verifyPeer else { return }
        let ok =
            isIPAddress
            ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
            : SSL_set1_host(ssl, name) == 1
        if !ok { throw TLSError.configuration("cannot verify against server name \(name.debugDescription)") }
    }

    private func freeSession() {
        guard let ssl else { return }
        SSL_free(ssl)  // frees both BIOs too
        self.ssl = nil
        self.readBIO = nil
        self.writeBIO = nil
        configuration.liveSessions.wrappingSubtract(1, ordering: .relaxed)
    }

    // MARK: Handshake

    private func armHandshakeTimeout(context: ChannelHandlerContext) {
        guard let handshakeTimeout, handshakeDeadline == nil, state == .idle || state == .handshaking else { return }
        handshakeDeadline = context.eventLoop.assumeIsolated().scheduleTask(in: handshakeTimeout) {
            self.handshakeDeadline = nil
            guard self.state == .idle || self.state == .handshaking else { return }
            self.fail(
                context: context,
                TLSError(.handshakeTimeout, "no completed handshake within \(handshakeTimeout.nanoseconds / 1_000_000) ms"))
        }
    }

    private func startHandshake(context: ChannelHandlerContext) {
        guard ssl != nil else { return }
        state = .handshaking
        doHandshake(context: context)
    }

    private func doHandshake(context: ChannelHandlerContext) {
        guard let ssl else { return }
        ERR_clear_error()
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            handshakeCompleted(context: context, ssl: ssl)
            return
        }
        switch SSL_get_error(ssl, rc) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            writeCiphertext(context: context, flush: true)
        default:
            fail(context: context, handshakeError(ssl))
        }
    }

    private func handshakeCompleted(context: ChannelHandlerContext, ssl: OpaquePointer) {
        state = .active
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
        var selected: UnsafePointer<UInt8>? = nil
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &selected, &length)
        if let selected, length > 0 {
            negotiatedProtocol = String(decoding: UnsafeBufferPointer(start: selected, count: Int(length)), as: UTF8.self)
        }
        if let version = SSL_get_version(ssl) { protocolVersion = String(cString: version) }
        logger.debug(
            "TLS handshake completed",
            metadata: [
                "tls.version": "\(protocolVersion ?? "?")", "tls.alpn": "\(negotiatedProtocol ?? "none")",
                "tls.role": "\(configuration.role)",
            ])

        // The last handshake flight (client Finished, server session tickets) goes out before any
        // application data a handler might write in reaction to the event.
        writeCiphertext(context: context, flush: false)
        context.fireUserInboundEventTriggered(TLSHandshakeCompleted(negotiatedProtocol: negotiatedProtocol))
        guard state == .active else { return }  // the event's handler may have closed the channel
        if flushedCount > 0 {
            encryptFlushedWrites(context: context)  // writes and flushes, including the flight above
        } else {
            context.flush()
        }
        guard state == .active else { return }
        // Application data can arrive in the same read as the peer's Finished.
        readPlaintext(context: context)
    }

    private func handshakeError(_ ssl: OpaquePointer) -> TLSError {
        if configuration.role == .client, let rejected = peerRejectedCertificate() { return rejected }
        let detail = TLSError.drainOpenSSLErrors()
        // Only a verifying side's result means anything: with SSL_VERIFY_NONE the chain is still
        // checked and the result recorded, but ignored, so it must not relabel another failure.
        let verify = SSL_get_verify_result(ssl)
        if configuration.verifyPeer, verify != X509_V_OK {
            let reason = String(cString: X509_verify_cert_error_string(verify))
            switch configuration.role {
            case .client:
                let name = serverName.map { " for \($0.debugDescription)" } ?? ""
                return TLSError(.certificateVerificationFailed, "\(reason) (X.509 error \(verify))\(name)")
            case .server:
                return TLSError(.certificateVerificationFailed, "client certificate: \(reason) (X.509 error \(verify))")
            }
        }
        if configuration.role == .server, configuration.requiresClientCertificate,
            detail.contains("peer did not return a certificate")
        {
            return TLSError(.handshakeFailed, "the client presented no certificate, and this server requires one (\(detail))")
        }
        return TLSError(.handshakeFailed, detail.isEmpty ? "OpenSSL gave no reason" : detail)
    }

    /// A client whose certificate (or lack of one) the server refused: the alert it sent, named
    /// plainly. Under TLS 1.3 it arrives after the client's handshake finished, as the first
    /// record it reads; under TLS 1.2, during the handshake. Drains the error queue when it matches.
    private func peerRejectedCertificate() -> TLSError? {
        guard let reason = TLSError.peerCertificateAlert() else { return nil }
        let detail = TLSError.drainOpenSSLErrors()
        let presented =
            configuration.presentsCertificate
            ? "" : "; configure a client certificate signed by a CA the server trusts"
        return TLSError(.certificateRejectedByPeer, "\(reason)\(presented) (\(detail))")
    }

    // MARK: Reading

    /// Decrypts everything the read BIO holds into one plaintext buffer and fires it once.
    private func readPlaintext(context: ChannelHandlerContext) {
        guard let ssl else { return }
        var buffer = takeBuffer(&plaintextBuffer, context: context, capacity: Self.readChunk)
        var sawCloseNotify = false
        var failure: TLSError? = nil
        reading: while true {
            var rc: Int32 = 0
            ERR_clear_error()
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.readChunk) { pointer in
                var count = 0
                rc = SSL_read_ex(ssl, pointer.baseAddress, pointer.count, &count)
                return rc == 1 ? count : 0
            }
            if rc == 1 { continue }
            switch SSL_get_error(ssl, rc) {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
                break reading
            case SSL_ERROR_ZERO_RETURN:
                sawCloseNotify = true
                break reading
            default:
                if configuration.role == .client, let rejected = peerRejectedCertificate() {
                    failure = rejected
                    break reading
                }
                let detail = TLSError.drainOpenSSLErrors()
                failure = TLSError(.protocolError, detail.isEmpty ? "OpenSSL gave no reason" : detail)
                break reading
            }
        }
        // Post-handshake messages may need an answer (TLS 1.3 KeyUpdate).
        if failure == nil { writeCiphertext(context: context, flush: true) }

        if buffer.readableBytes > 0, state == .active {
            firedPlaintext = true
            let delivered = buffer
            plaintextBuffer = buffer
            context.fireChannelRead(wrapInboundOut(delivered))
        } else {
            plaintextBuffer = buffer
        }
        if let failure {
            fail(context: context, failure)
        } else if sawCloseNotify, !receivedCloseNotify {
            receivedCloseNotify = true
            peerSentCloseNotify(context: context)
        }
    }

    private func peerSentCloseNotify(context: ChannelHandlerContext) {
        guard state == .active else { return }  // closing: our own close is already under way
        let halfClosureAllowed =
            (try? context.channel.syncOptions?.getOption(ChannelOptions.allowRemoteHalfClosure)) ?? false
        if halfClosureAllowed {
            context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        } else {
            close(context: context, mode: .all, promise: nil)
        }
    }

    // MARK: Writing

    /// Encrypts the flushed writes in order, writes the ciphertext, flushes, and completes their
    /// promises with the last ciphertext write.
    private func encryptFlushedWrites(context: ChannelHandlerContext) {
        guard let ssl else { return }
        var out = takeBuffer(&ciphertextBuffer, context: context, capacity: Self.readChunk + 512)
        var completion: EventLoopPromise<Void>? = nil
        var failure: TLSError? = nil

        writing: while flushedCount > 0 {
            var write = pendingWrites.removeFirst()
            flushedCount -= 1
            while write.data.readableBytes > 0 {
                let chunk = min(write.data.readableBytes, Self.writeChunk)
                var written = 0
                ERR_clear_error()
                let rc = write.data.withUnsafeReadableBytes { SSL_write_ex(ssl, $0.baseAddress, chunk, &written) }
                if rc == 1 {
                    write.data.moveReaderIndex(forwardBy: written)
                    drainWriteBIO(into: &out)
                    if out.readableBytes >= Self.ciphertextBatch {
                        context.write(wrapOutboundOut(out), promise: nil)
                        out = context.channel.allocator.buffer(capacity: Self.ciphertextBatch + Self.writeChunk)
                    }
                    continue
                }
                switch SSL_get_error(ssl, rc) {
                case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
                    // Retried (same bytes) after the next read.
                    pendingWrites.prepend(write)
                    flushedCount += 1
                    break writing
                default:
                    let detail = TLSError.drainOpenSSLErrors()
                    failure = TLSError(.protocolError, detail.isEmpty ? "SSL_write failed" : detail)
                    write.promise?.fail(failure!)
                    break writing
                }
            }
            if let promise = write.promise {
                if let completion { completion.futureResult.cascade(to: promise) } else { completion = promise }
            }
        }
        drainWriteBIO(into: &out)
        if out.readableBytes > 0 {
            context.write(wrapOutboundOut(out), promise: completion)
        } else {
            completion?.succeed()
        }
        context.flush()
        ciphertextBuffer = out
        if let failure { fail(context: context, failure) }
    }

    /// Sends whatever OpenSSL has queued in the write BIO (handshake flights, alerts, tickets).
    private func writeCiphertext(context: ChannelHandlerContext, flush: Bool, promise: EventLoopPromise<Void>? = nil) {
        guard let writeBIO, copenssl_bio_pending(writeBIO) > 0 else {
            if flush { context.flush() }
            promise?.succeed()
            return
        }
        var out = takeBuffer(&ciphertextBuffer, context: context, capacity: Self.readChunk + 512)
        drainWriteBIO(into: &out)
        context.write(wrapOutboundOut(out), promise: promise)
        if flush { context.flush() }
        ciphertextBuffer = out
    }

    private func drainWriteBIO(into out: inout ByteBuffer) {
        guard let writeBIO else { return }
        while true {
            let pending = Int(copenssl_bio_pending(writeBIO))
            if pending <= 0 { return }
            let read = out.writeWithUnsafeMutableBytes(minimumWritableBytes: pending) { pointer in
                Int(max(0, BIO_read(writeBIO, pointer.baseAddress, Int32(clamping: pointer.count))))
            }
            if read == 0 { return }
        }
    }

    /// A recycled buffer: the previous one cleared (same storage if nobody else holds it).
    private func takeBuffer(_ slot: inout ByteBuffer?, context: ChannelHandlerContext, capacity: Int) -> ByteBuffer {
        guard var buffer = slot.take() else { return context.channel.allocator.buffer(capacity: capacity) }
        // Do not pin a huge buffer to an idle connection after one large burst.
        if buffer.capacity > 4 * Self.ciphertextBatch { return context.channel.allocator.buffer(capacity: capacity) }
        buffer.clear()
        return buffer
    }

    // MARK: Closing and failing

    private func sendCloseNotify(context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        sentCloseNotify = true
        let promise = context.eventLoop.makePromise(of: Void.self)
        if let ssl {
            ERR_clear_error()
            _ = SSL_shutdown(ssl)
            ERR_clear_error()
        }
        writeCiphertext(context: context, flush: true, promise: promise)
        return promise.futureResult
    }

    private func closeAfterCloseNotify(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        let written = sendCloseNotify(context: context)
        let timeout = context.eventLoop.assumeIsolated().scheduleTask(in: shutdownTimeout) {
            self.forwardClose(context: context, promise: nil)
        }
        written.assumeIsolated().whenComplete { _ in
            timeout.cancel()
            self.forwardClose(context: context, promise: promise)
        }
    }

    private func forwardClose(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        if closeForwarded {
            if let promise { context.channel.closeFuture.cascade(to: promise) }
            return
        }
        closeForwarded = true
        context.close(mode: .all, promise: promise)
    }

    private func fail(context: ChannelHandlerContext, _ error: TLSError) {
        guard state != .closed else { return }
        state = .closed
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
        logger.debug("TLS failure", metadata: ["tls.error": "\(error)", "tls.role": "\(configuration.role)"])
        writeCiphertext(context: context, flush: true)  // the alert OpenSSL queued, if any
        failPendingWrites(error)
        context.fireErrorCaught(error)
        forwardClose(context: context, promise: nil)
    }

    private func failPendingWrites(_ error: any Error) {
        flushedCount = 0
        while let write = pendingWrites.popFirst() { write.promise?.fail(error) }
    }
}
