import Observability
import RPCCore
import RPCTransport

/// One public service of the cluster as the gateway serves it: every method a raw handler that
/// relays the call to the service's upstream, bytes unchanged.
struct ProxyService: RPCService {
    let serviceName: String
    let methods: [ServerMethod]
}

/// Relays calls to one upstream. All four call kinds keep their shape: messages flow both ways
/// as they come (backpressure: a request is read from the client only when the upstream can
/// take it, a response only when the client can take it), metadata and the deadline (capped) go
/// up, headers, trailers and the status (with `grpc-status-details-bin`) come back, and a
/// cancellation on either side cancels the other.
struct Proxy: Sendable {
    let pool: UpstreamPool
    let gatewayToken: String
    /// Cap on the deadline of unary and client-streaming calls (also their deadline when the
    /// client sets none).
    let maxDeadline: Duration
    /// Cap for server-streaming and bidirectional calls (subscriptions live long).
    let maxStreamDeadline: Duration
    /// Ends calls without a client deadline once they reach the cap.
    let sweeper: DeadlineSweeper
    /// The process's tracer: relayed calls are spans and carry `traceparent` up (`Proxy+Tracing`).
    /// Nil (tracing off): the handlers below are used as they are, with no work for tracing.
    var tracer: SpanTracer? = nil

    func handler(for method: MethodDescriptor) -> RawHandler {
        if let tracer { return tracedHandler(for: method, tracer: tracer) }
        switch method.kind {
        case .unary:
            return .unaryForwarding { request, context, cancellation, done in
                unary(method, request, context, cancellation, done)
            }
        case .serverStreaming:
            return .serverStreaming { request, sink, context in try await serverStreaming(method, request, sink, context) }
        case .clientStreaming, .bidirectionalStreaming:
            return .bidirectionalStreaming { requests, sink, context in try await streaming(method, requests, sink, context) }
        }
    }

    /// The deadline cap of a call kind: subscriptions (server streaming, bidirectional) live long.
    func cap(for kind: CallKind) -> Duration { kind.serverStreams ? maxStreamDeadline : maxDeadline }

    static let capReached = RPCError.deadlineExceeded("the call reached the gateway's deadline limit")

    /// The upstream call's options: the client's metadata (filtered) and deadline (capped). A
    /// call without a client deadline goes up without one and is capped by the sweeper. `trace`:
    /// the gateway's span, sent up as `traceparent`/`tracestate` in place of the client's.
    func options(_ context: ServerContext, kind: CallKind, trace: TraceContext? = nil) throws -> CallOptions {
        var timeout: Duration? = nil
        if let remaining = context.timeRemaining {
            guard remaining > .zero else { throw RPCError.deadlineExceeded() }
            timeout = min(remaining, cap(for: kind))
        }
        let metadata =
            if let trace {
                HeaderPolicy.upstreamMetadata(
                    context.requestMetadata, clientAddress: context.peerHost, gatewayToken: gatewayToken,
                    traceparent: trace.traceparent, tracestate: trace.traceState)
            } else {
                HeaderPolicy.upstreamMetadata(
                    context.requestMetadata, clientAddress: context.peerHost,
                    gatewayToken: gatewayToken)
            }
        return CallOptions(timeout: timeout, metadata: metadata)
    }

    /// The upstream's status as the error the gateway answers with (details kept).
    static func error(_ status: RPCStatus, _ trailers: Metadata) -> RPCError {
        var t = trailers
        let details = t.binary("grpc-status-details-bin")
        t.remove("grpc-status-details-bin")
        return RPCError(status.code, status.message, trailers: t, details: details)
    }

    /// A streaming relay's upstream call: started on this loop's pool, watched by the sweeper
    /// when it has no deadline of its own, cancelled with the client's call. A failure of `body`
    /// becomes the upstream's own status when the upstream ended the call.
    func withUpstreamCall(
        _ method: MethodDescriptor, _ context: ServerContext, trace: TraceContext? = nil,
        _ body: (any RawClientCall) async throws -> Void
    ) async throws {
        let options = try options(context, kind: method.kind, trace: trace)
        let lease = pool.acquire()
        defer { pool.release(lease) }
        let call = try await lease.channel.startCall(method, options: options)
        let watch = options.timeout == nil ? sweeper.watch(call, for: cap(for: method.kind)) : nil
        defer { watch?.disarm() }
        try await withTaskCancellationHandler {
            do {
                try await body(call)
            } catch {
                if let watch, watch.isCancelled { throw Self.capReached }
                call.cancel()  // no-op when the upstream already ended it
                let (status, trailers) = await call.finalStatus()
                throw status.code == .ok ? error : Self.error(status, trailers)
            }
        } onCancel: {
            call.cancel()
        }
    }

    /// Upstream response headers, status and trailers → the gateway's response.
    static func finish(_ call: any RawClientCall, _ context: ServerContext) async throws {
        let (status, trailers) = await call.finalStatus()
        guard status.code == .ok else { throw error(status, trailers) }
        context.trailers = trailers
    }

    /// Unary calls relay without a task: the upstream stream opens on a connection of the
    /// calling event loop, the request leaves with its headers, and the upstream's answer
    /// completes the client's call from the connection's read (see `PendingUnaryCall`).
    func unary(
        _ method: MethodDescriptor, _ request: [UInt8], _ context: ServerContext, _ cancellation: CallCancellation,
        _ done: @escaping @Sendable (Result<[UInt8], any Error>) -> Void, trace: TraceContext? = nil
    ) {
        let options: CallOptions
        do { options = try self.options(context, kind: .unary, trace: trace) } catch { return done(.failure(error)) }
        let pool = self.pool
        let lease = pool.acquire()
        let watch = options.timeout == nil ? sweeper.watch(for: cap(for: .unary)) : nil
        let call = lease.channel.unary(method, request: request, options: options) { result in
            pool.release(lease)
            // Disarming drops the call from the watch (the call holds this closure, which holds the watch).
            watch?.disarm()
            cancellation.disarm()
            done(Self.outcome(result, method, context, expired: watch?.isCancelled ?? false))
        }
        cancellation.onCancel(cancelling: call)
        watch?.onCancel(cancelling: call)
    }

    /// The upstream's answer to a unary call as the gateway's: its message, headers and
    /// trailers, or its status (details kept).
    static func outcome(
        _ r: UnaryCallResult, _ method: MethodDescriptor, _ context: ServerContext,
        expired: Bool
    ) -> Result<[UInt8], any Error> {
        // Headers go back on errors too (Trailers-Only carries them); an answer that made it in
        // time is kept even if the sweeper fired meanwhile.
        context.initialMetadata = r.initialMetadata
        guard r.status.code == .ok else { return .failure(expired ? capReached : error(r.status, r.trailers)) }
        guard r.responseCount == 1, let response = r.response else {
            return .failure(RPCError(.internal, "\(method.path): upstream sent \(r.responseCount) response messages to a unary call"))
        }
        context.trailers = r.trailers
        return .success(response)
    }

    func serverStreaming(
        _ method: MethodDescriptor, _ request: [UInt8], _ sink: any ServerResponseSink,
        _ context: ServerContext, trace: TraceContext? = nil
    ) async throws {
        try await withUpstreamCall(method, context, trace: trace) { call in
            try await call.send(request, compress: false)
            try await call.closeSend()
            try await relayResponses(call, sink, context)
        }
    }

    func streaming(
        _ method: MethodDescriptor, _ requests: RawMessageStream, _ sink: any ServerResponseSink,
        _ context: ServerContext, trace: TraceContext? = nil
    ) async throws {
        try await withUpstreamCall(method, context, trace: trace) { call in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await Self.pumpRequests(requests, into: call) }
                // When the upstream has answered (or failed), stop reading the client's requests.
                defer { group.cancelAll() }
                do {
                    try await relayResponses(call, sink, context)
                } catch {
                    // The pump may be suspended in a send the upstream is not reading: cancelling
                    // the call ends it (the group waits for the pump before it returns).
                    call.cancel()
                    throw error
                }
            }
        }
    }

    /// Client → upstream. Reads a request only once the upstream accepted the previous one, so
    /// a fast client is held back by HTTP/2 flow control rather than buffered here.
    static func pumpRequests(_ requests: RawMessageStream, into call: any RawClientCall) async {
        while true {
            let next: RawMessageStream.InboundMessage?
            do { next = try await requests.next() } catch {
                // The client's stream broke (cancelled, deadline): the upstream call goes too.
                call.cancel()
                return
            }
            guard let message = next else {
                try? await call.closeSend()
                return
            }
            do { try await call.send(message.bytes, compress: false) } catch {
                return  // the upstream ended the call; its status arrives with the responses
            }
        }
    }

    /// Upstream → client: headers as soon as they arrive, then each message, then the status.
    func relayResponses(_ call: any RawClientCall, _ sink: any ServerResponseSink, _ context: ServerContext) async throws {
        context.initialMetadata = try await call.initialMetadata()
        try await sink.sendInitialMetadata()
        for try await m in call.responses {
            try await sink.write(m.bytes, compress: nil)
        }
        try await Self.finish(call, context)
    }
}
