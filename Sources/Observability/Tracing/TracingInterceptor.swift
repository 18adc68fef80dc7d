import RPCCore

/// Every call a process serves, in a server span: the first of its interceptors, so the span
/// covers the access policy too and a call the policy refuses is a span with its status. Its
/// parent is the caller's `traceparent`, or it starts a trace. Services whose calls are not
/// traced (health and reflection: probes would fill the traces) are left out, decided once per
/// method.
///
/// Two roles:
/// - `.service`: the trace is the task-local `TraceContext.current` of the rest of the chain and
///   the handler (peer calls and outbox events made there carry it on). A call the gateway relays
///   without a `traceparent` (a trace it started and did not sample) is not traced at all
///   (`RPCTracing.startServiceCall`).
/// - `.relay` (the gateway): the context the upstream call carries is noted on the call
///   (`RPCTracing.upstreamTrace`), where the relay finds it; nothing is bound around it.
public struct TracingInterceptor: ServerInterceptor {
    public enum Role: Sendable {
        case service
        case relay
    }

    public let tracer: SpanTracer
    public let role: Role
    /// Services whose calls are not traced.
    public let untraced: Set<String>
    /// The span name, made once per method (`specialized(for:)`).
    let name: String

    public init(tracer: SpanTracer, role: Role = .service, untraced: Set<String> = []) {
        self.init(tracer: tracer, role: role, untraced: untraced, name: "")
    }

    init(tracer: SpanTracer, role: Role, untraced: Set<String>, name: String) {
        self.tracer = tracer
        self.role = role
        self.untraced = untraced
        self.name = name
    }

    public func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)? {
        untraced.contains(method.service) ? nil : TracingInterceptor(tracer: tracer, role: role, untraced: [], name: RPCTracing.spanName(method))
    }

    /// A service passes over a call the gateway relayed without a `traceparent` (a trace it
    /// started and did not sample): no frame of its own around the handler.
    public func passes(_ context: ServerContext) -> Bool {
        role == .service && RPCTracing.isUnsampledRelay(context.requestMetadata)
    }

    /// The call's span, and the trace to bind around the rest of it (services only); nil when
    /// the call is not traced at all.
    private func start(_ context: ServerContext) -> (bind: TraceContext?, span: TraceSpan?)? {
        switch role {
        case .service:
            guard let (trace, span) = RPCTracing.startServiceCall(tracer, name, context.method, context) else { return nil }
            return (trace, span)
        case .relay:
            return (nil, RPCTracing.startRelayCall(tracer, name, context.method, context))
        }
    }

    public func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        guard let (bind, span) = start(call.context) else { return try await next(call) }
        let result: Result<[UInt8], any Error>
        do {
            if let bind {
                result = .success(try await TraceContext.withCurrent(bind) { try await next(call) })
            } else {
                result = .success(try await next(call))
            }
        } catch {
            result = .failure(error)
        }
        RPCTracing.end(span, result, call.context)
        return try result.get()
    }

    /// Task-free, as the call is: the span ends with the answer (a sampled call's answer is
    /// wrapped; an unsampled one's is left as it is).
    public func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        guard let (bind, span) = start(call.context), bind != nil || span != nil else { return next(call) }
        var call = call
        if let span { call.answer = RPCTracing.ending(call.answer, span, call.context) }
        guard let bind else { return next(call) }
        let traced = call
        return TraceContext.withCurrent(bind) { next(traced) }
    }
}

/// The gateway's relay skips tracing for a call it would not trace (`RelayGate`): one with no
/// `traceparent` whose new trace is not sampled (no span, nothing sent upstream, nothing noted),
/// the 99 % of calls at a ratio of 1 %. A sampled one runs through the chain with the trace drawn
/// here (`RPCTracing.drawnRootKey`), so the draw is made once and the ratio holds.
extension TracingInterceptor: RelayGate {
    public func relayPart(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RelayPart {
        guard role == .relay, !tracer.notesCalls else { return .takesPart(note: nil) }
        if metadata.withFirstValue(of: "traceparent", { $0 != nil }) { return .takesPart(note: nil) }
        let root = tracer.newRoot()
        guard root.sampled else { return .passes }
        return .takesPart(note: (RPCTracing.drawnRootKey, root))
    }
}
