import RPCCore

/// Every call a service's handler gets, in a server span: the first of a process's interceptors
/// (`ServiceHost` puts it outermost), so the span covers the access policy too and a call the
/// policy refuses is a span with its status. Its parent is the caller's `traceparent`, or it
/// starts a trace; the trace is the task-local `TraceContext.current` of the rest of the chain
/// and the handler (peer calls and outbox events made there carry it on). A call the gateway
/// relays without a `traceparent` (a trace it started and did not sample) is not traced at all
/// (`RPCTracing.startServiceCall`).
///
/// Health and reflection are left out (probes would fill the traces), decided once per method.
public struct TracingInterceptor: ServerInterceptor {
    public let tracer: SpanTracer
    /// Services whose calls are not traced.
    public let untraced: Set<String>
    /// The span name, made once per method (`specialized(for:)`).
    let name: String

    public init(tracer: SpanTracer, untraced: Set<String> = []) {
        self.init(tracer: tracer, untraced: untraced, name: "")
    }

    init(tracer: SpanTracer, untraced: Set<String>, name: String) {
        self.tracer = tracer
        self.untraced = untraced
        self.name = name
    }

    public func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)? {
        untraced.contains(method.service) ? nil : TracingInterceptor(tracer: tracer, untraced: [], name: RPCTracing.spanName(method))
    }

    public func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        guard let (trace, span) = RPCTracing.startServiceCall(tracer, name, call.method, call.context) else {
            return try await next(call)
        }
        do {
            let response = try await TraceContext.withCurrent(trace) { try await next(call) }
            RPCTracing.end(span, .ok)
            return response
        } catch {
            RPCTracing.end(span, error, call.context)
            throw error
        }
    }

    /// Task-free, as the call is: the span ends with the answer (a sampled call's answer is
    /// wrapped; an unsampled one's is left as it is).
    public func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        guard let (trace, span) = RPCTracing.startServiceCall(tracer, name, call.method, call.context) else { return next(call) }
        var call = call
        if let span {
            switch call.answer {
            case .message(let responder): call.answer = .message(SpanEndingResponder(responder, span, call.context))
            case .stream(let forwarder): call.answer = .stream(SpanEndingForwarder(forwarder, span, call.context))
            }
        }
        let traced = call
        return TraceContext.withCurrent(trace) { next(traced) }
    }
}
