import Observability
import RPCCore
import RPCTransport
import ServiceKit

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
    /// The upstream's channels; they add the gateway's credential to every call
    /// (`ChannelConfiguration.metadata`).
    let pool: UpstreamPool
    /// Cap on the deadline of unary and client-streaming calls (also their deadline when the
    /// client sets none).
    let maxDeadline: Duration
    /// Cap for server-streaming and bidirectional calls (subscriptions live long).
    let maxStreamDeadline: Duration
    /// The process's tracer. With one, each relayed call is a server span made by the gateway's
    /// first interceptor (`TracingInterceptor`, role `.relay`: before the policy, so a call the
    /// policy refuses is a span too), whose parent is the client's `traceparent` (or, with none or
    /// a malformed one, the first span of a new trace, sampled at `TRACE_SAMPLE_RATIO`); the
    /// upstream call carries that span's context as its `traceparent` (and the client's
    /// `tracestate`), so the service's span is its child (`options`). A trace the gateway started
    /// and did not sample is not sent up at all (`RPCTracing.startRelayCall`). Nil (tracing off):
    /// the client's headers go up as they are.
    var tracer: SpanTracer? = nil
    /// The policy unary calls are relayed under without a context (`ProxyRelay`), when nothing
    /// else needs one: no access log (the verified caller is noted there). With a tracer, a call
    /// it traces (a `traceparent`, or a new trace it samples) takes the context path, through
    /// the chain, and the rest are relayed (`TracingInterceptor` is a `RelayGate`). Nil: unary
    /// calls take the context path, through the chain.
    var relayPolicy: GatewayPolicy? = nil

    init(
        pool: UpstreamPool, maxDeadline: Duration, maxStreamDeadline: Duration, tracer: SpanTracer? = nil,
        relayPolicy: GatewayPolicy? = nil
    ) {
        self.pool = pool
        self.maxDeadline = maxDeadline
        self.maxStreamDeadline = maxStreamDeadline
        self.tracer = tracer
        self.relayPolicy = relayPolicy
        self.unaryLimit = CallLimit(after: maxDeadline, message: Self.capReached)
        self.streamLimit = CallLimit(after: maxStreamDeadline, message: Self.capReached)
    }

    func handler(for method: MethodDescriptor) -> RawHandler {
        switch method.kind {
        case .unary:
            if let relayPolicy { return .unaryRelay(ProxyRelay(self, relayPolicy)) }
            return .unaryForwarding { request, context, responder in
                unary(method, request, context, responder)
            }
        case .serverStreaming:
            return .serverStreamingForwarding { request, context, responses in
                serverStreaming(method, request, context, responses)
            }
        case .clientStreaming, .bidirectionalStreaming:
            return .bidirectionalStreaming { requests, sink, context in try await streaming(method, requests, sink, context) }
        }
    }

    /// The deadline cap of a call kind: subscriptions (server streaming, bidirectional) live long.
    func cap(for kind: CallKind) -> Duration { kind.serverStreams ? maxStreamDeadline : maxDeadline }

    static let capReached = "the call reached the gateway's deadline limit"

    func limit(for kind: CallKind) -> CallLimit { kind.serverStreams ? streamLimit : unaryLimit }
    /// The limits of calls without a deadline of their own, made once.
    let unaryLimit: CallLimit
    let streamLimit: CallLimit

    /// The upstream call's options: the client's metadata (filtered) and deadline (capped). A
    /// call without a client deadline goes up without one, limited to the cap by the channel
    /// (`CallOptions.limit`: no timer per call). When the gateway traces, its span's context goes
    /// up as `traceparent`/`tracestate` in place of the client's.
    func options(_ context: ServerContext, kind: CallKind) throws -> CallOptions {
        try options(
            context.requestMetadata, deadline: context.deadline, peerHost: context.peerHost,
            trace: tracer == nil ? nil : RPCTracing.upstreamTrace(context), kind: kind)
    }

    func options(
        _ metadata: Metadata, deadline: ContinuousClock.Instant?, peerHost: String, trace: TraceContext?, kind: CallKind
    ) throws(RPCError) -> CallOptions {
        var options = try self.options(deadline: deadline, kind: kind)
        options.metadata = HeaderPolicy.upstreamMetadata(metadata, clientAddress: peerHost, trace: trace)
        return options
    }

    /// An upstream call's deadline (the client's, capped) or, without one, its limit.
    func options(deadline: ContinuousClock.Instant?, kind: CallKind) throws(RPCError) -> CallOptions {
        var timeout: Duration? = nil
        if let deadline {
            let remaining = deadline - .now
            guard remaining > .zero else { throw RPCError.deadlineExceeded() }
            timeout = min(remaining, cap(for: kind))
        }
        return CallOptions(timeout: timeout, limit: timeout == nil ? limit(for: kind) : nil)
    }

    /// The upstream's status as the error the gateway answers with (details kept).
    static func error(_ status: RPCStatus, _ trailers: Metadata) -> RPCError {
        var t = trailers
        let details = t.binary("grpc-status-details-bin")
        t.remove("grpc-status-details-bin")
        return RPCError(status.code, status.message, trailers: t, details: details)
    }

    /// A streaming relay's upstream call: started on this loop's pool, limited to the cap when it
    /// has no deadline of its own, cancelled with the client's call. A failure of `body` becomes
    /// the upstream's own status when the upstream ended the call.
    func withUpstreamCall(
        _ method: MethodDescriptor, _ context: ServerContext,
        _ body: (any RawClientCall) async throws -> Void
    ) async throws {
        let options = try options(context, kind: method.kind)
        let lease = try pool.acquire()
        defer { lease.released() }
        let call: any RawClientCall
        do {
            call = try await lease.channel.startCall(method, options: options)
        } catch let e as RPCError {
            // It never reached the upstream.
            throw Self.error(lease.worded(RPCStatus(e.code, e.message), fromPeer: false), e.trailers)
        }
        try await withTaskCancellationHandler {
            do {
                try await body(call)
            } catch {
                call.cancel()  // no-op when the upstream already ended it
                let (status, trailers) = await call.finalStatus()
                if status.code == .ok { throw error }
                throw Self.error(lease.worded(status, fromPeer: call.statusCameFromPeer), trailers)
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
    /// completes the client's call from the connection's read. One object per relayed call
    /// (`RelayedUnaryCall`) is the upstream call, what cancels it and what answers the client.
    func unary(
        _ method: MethodDescriptor, _ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder
    ) -> (any Cancellable)? {
        let options: CallOptions
        let lease: PooledChannel
        do {
            options = try self.options(context, kind: .unary)
            lease = try pool.acquire()
        } catch {
            responder.respond(.failure(error))
            return nil
        }
        let call = RelayedUnaryCall(request, method, .context(context, responder), lease)
        lease.channel.start(call, method, options: options)
        return call
    }

    /// The same relay without a context (`ProxyRelay`, checked already): the upstream's headers
    /// and trailers go back with the answer. (Written out, not shared with `unary` through
    /// closures: each closure would retain what it captures, on every call.)
    func relay(
        _ request: [UInt8], _ method: MethodDescriptor, _ metadata: MetadataBytes, deadline: ContinuousClock.Instant?,
        peerHost: String, added: MetadataBytes?, _ responder: any RelayResponder
    ) -> (any Cancellable)? {
        var options: CallOptions
        let lease: PooledChannel
        do {
            options = try self.options(deadline: deadline, kind: .unary)
            options.forwardedMetadata = HeaderPolicy.forwarded(metadata)
            options.addedMetadata = added ?? HeaderPolicy.added(clientAddress: peerHost)
            lease = try pool.acquire()
        } catch {
            responder.respond(.failure(error), headers: Metadata(), trailers: Metadata())
            return nil
        }
        let call = RelayedUnaryCall(request, method, .relay(responder), lease)
        lease.channel.start(call, method, options: options)
        return call
    }

    /// The upstream's answer to a unary call as the gateway's: its message, or its status as
    /// the error (details kept); and the headers and trailers to send with it (headers go back
    /// on errors too, Trailers-Only carries them; an error's trailers are in the error).
    static func outcome(
        _ r: consuming UnaryCallResult, _ method: MethodDescriptor
    ) -> (result: Result<[UInt8], any Error>, headers: Metadata, trailers: Metadata) {
        guard r.status.code == .ok else { return (.failure(error(r.status, r.trailers)), r.initialMetadata, Metadata()) }
        guard r.responseCount == 1, r.response != nil else {
            return (
                .failure(RPCError(.internal, "\(method.path): upstream sent \(r.responseCount) response messages to a unary call")),
                r.initialMetadata, Metadata()
            )
        }
        return (.success(r.response.take()!), r.initialMetadata, r.trailers)  // the message moved out, not copied
    }

    /// Server streams relay without a task too: the upstream stream opens on a connection of
    /// the calling loop, and each upstream message is queued for the client from the upstream
    /// connection's read (`RelayedServerStream`). While the client is slow, the upstream's bytes
    /// are held in its flow-control window, so a fast upstream is held back there.
    func serverStreaming(
        _ method: MethodDescriptor, _ request: [UInt8], _ context: ServerContext, _ responses: any ResponseForwarder
    ) -> (any Cancellable)? {
        let options: CallOptions
        let lease: PooledChannel
        do {
            options = try self.options(context, kind: .serverStreaming)
            lease = try pool.acquire()
        } catch {
            responses.end(.failure(error))
            return nil
        }
        let call = RelayedServerStream(request, context, responses, lease)
        lease.channel.start(call, method, options: options)
        return call
    }

    func streaming(
        _ method: MethodDescriptor, _ requests: RawMessageStream, _ sink: any ServerResponseSink,
        _ context: ServerContext
    ) async throws {
        try await withUpstreamCall(method, context) { call in
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

/// One relayed unary call: the upstream call, what cancels it (the client's call ending early
/// cancels it) and what its answer completes: the client's call through its context, or
/// straight through the transport's stream (`ProxyRelay`: no context).
final class RelayedUnaryCall: PendingUnaryCall, @unchecked Sendable {
    enum Answer {
        case context(ServerContext, any UnaryResponder)
        case relay(any RelayResponder)
    }
    let method: MethodDescriptor
    let lease: PooledChannel
    /// Dropped once answered (it may hold this call, to cancel it).
    private var answer: Answer?

    init(_ request: [UInt8], _ method: MethodDescriptor, _ answer: Answer, _ lease: PooledChannel) {
        self.method = method
        self.lease = lease
        self.answer = answer
        super.init(request: request)
    }

    override func completed(_ result: consuming UnaryCallResult) {
        lease.released()
        guard let answer = answer.take() else { return }
        if result.status.code != .ok { result.status = lease.worded(result.status, fromPeer: statusCameFromPeer) }
        let (outcome, headers, trailers) = Proxy.outcome(result, method)
        switch answer {
        case .relay(let responder):
            responder.respond(outcome, headers: headers, trailers: trailers)
        case .context(let context, let responder):
            // Set only when there are some (usually none): each set takes the context's lock.
            if headers.count > 0 { context.initialMetadata = headers }
            if trailers.count > 0 { context.trailers = trailers }
            responder.respond(outcome)
        }
    }
}

/// The gateway's unary relay without a context (`RawHandler.unaryRelay`): the policy decides
/// from the call's values, and the proxy relays it. A token whose key is not loaded yet is
/// decided in a task (accounts' keys fetched), then relayed from there.
final class ProxyRelay: UnaryRelay {
    let proxy: Proxy
    let policy: GatewayPolicy

    init(_ proxy: Proxy, _ policy: GatewayPolicy) {
        self.proxy = proxy
        self.policy = policy
    }

    /// What the relay keeps about one client connection (`RelayConnection.state`, on its event
    /// loop only): the token it verified last, and the metadata it adds to the connection's
    /// calls (the client's address).
    final class ConnectionState {
        var token: AuthInterceptor.RememberedToken?
        let added: MetadataBytes

        init(peerHost: String) { added = HeaderPolicy.added(clientAddress: peerHost) }
    }

    var check: (any CallCheck)? { policy }

    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RPCError? {
        policy.rejectAtHeaders(method, metadata)
    }

    func relay(
        _ request: [UInt8], _ method: MethodDescriptor, _ metadata: MetadataBytes, deadline: ContinuousClock.Instant?,
        _ connection: RelayConnection, _ responder: any RelayResponder
    ) -> (any Cancellable)? {
        // The state is this type's (every relay of the gateway is one; a type check, not a cast).
        let state: ConnectionState
        if let s = connection.state, type(of: s) == ConnectionState.self {
            state = unsafeDowncast(s, to: ConnectionState.self)
        } else {
            state = ConnectionState(peerHost: connection.peerHost)
            connection.state = state
        }
        do {
            if try policy.decideNow(method, metadata, peerHost: connection.peerHost, remembering: &state.token) {
                return proxy.relay(
                    request, method, metadata, deadline: deadline, peerHost: connection.peerHost, added: state.added, responder)
            }
        } catch {
            responder.respond(.failure(error), headers: Metadata(), trailers: Metadata())
            return nil
        }
        let cancellation = CallCancellation()
        let proxy = self.proxy, policy = self.policy, peerHost = connection.peerHost
        Task {
            do {
                try await policy.decideLater(method, metadata, peerHost: peerHost)
            } catch {
                responder.respond(.failure(error), headers: Metadata(), trailers: Metadata())
                return
            }
            if let call = proxy.relay(request, method, metadata, deadline: deadline, peerHost: peerHost, added: nil, responder) {
                cancellation.onCancel(cancelling: call)
            }
        }
        return cancellation
    }

    func forward(_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)? {
        proxy.unary(context.method, request, context, responder)
    }
}

/// One relayed server stream: the upstream call, what cancels it, and the client's stream its
/// headers, messages and status go to as they arrive (all on one event loop: the upstream
/// connection is the client connection's loop's).
final class RelayedServerStream: TasklessCall, @unchecked Sendable {
    let context: ServerContext
    let lease: PooledChannel
    /// Dropped once the call ended (it may hold this call, to cancel it).
    private var responses: (any ResponseForwarder)?
    /// Upstream bytes held in the window while the client is behind, and whether a callback for
    /// when it catches up is registered.
    private var held = 0
    private var waiting = false

    init(
        _ request: [UInt8], _ context: ServerContext, _ responses: any ResponseForwarder, _ lease: PooledChannel
    ) {
        self.context = context
        self.responses = responses
        self.lease = lease
        super.init(request: request)
    }

    override func headersArrived(_ metadata: Metadata) {
        context.initialMetadata = metadata
        responses?.sendHeaders()
    }

    override func received(_ message: RawMessageStream.InboundMessage) -> Bool {
        guard let responses, !responses.forward(message.bytes) else { return true }
        // Queued, but the client is behind: its bytes stay in the upstream's window until it
        // catches up.
        held += message.wireSize
        if !waiting {
            waiting = true
            responses.whenWritable { [self] in
                let n = held
                held = 0
                waiting = false
                consumed(n)
            }
        }
        return false
    }

    override func ended(status: RPCStatus, trailers: Metadata, headers: Metadata?) {
        lease.released()
        guard let responses else { return }
        self.responses = nil
        if let headers { context.initialMetadata = headers }  // Trailers-Only
        if status.code == .ok {
            context.trailers = trailers
            responses.end(.success(()))
        } else {
            responses.end(.failure(Proxy.error(lease.worded(status, fromPeer: statusCameFromPeer), trailers)))
        }
    }
}
