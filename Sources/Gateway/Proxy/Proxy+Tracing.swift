import Observability
import RPCCore
import ServiceKit

/// Relayed calls as spans, when the gateway traces (`TRACE_EXPORT`): each call is a server span
/// whose parent is the client's `traceparent` (or, with none or a malformed one, the first span of
/// a new trace, sampled at `TRACE_SAMPLE_RATIO`), and the upstream call carries this span's
/// context as its `traceparent` (and the client's `tracestate`), so the service's span is its
/// child. The span is made by `GatewayTracing`, the gateway's outermost interceptor (before the
/// policy, so a call the policy refuses is a span too); the relay reads the context to send up
/// from the call (`tracedHandler`). With tracing off none of this exists and a relayed call does
/// nothing for it. An unsampled call has no span: it only carries the client's trace up (a trace
/// the gateway started and did not sample is not sent up at all, `startCall`); a sampled one's
/// span ends with the call, through a responder or forwarder that wraps the client's stream.
extension Proxy {
    func tracedHandler(for method: MethodDescriptor, tracer: SpanTracer) -> RawHandler {
        switch method.kind {
        case .unary:
            return .unaryForwarding { request, context, responder in
                unary(method, request, context, responder, trace: GatewayTracing.upstreamTrace(context))
            }
        case .serverStreaming:
            return .serverStreamingForwarding { request, context, responses in
                serverStreaming(method, request, context, responses, trace: GatewayTracing.upstreamTrace(context))
            }
        case .clientStreaming, .bidirectionalStreaming:
            return .bidirectionalStreaming { requests, sink, context in
                try await streaming(method, requests, sink, context, trace: GatewayTracing.upstreamTrace(context))
            }
        }
    }

    /// A relayed call's server span, and the context its upstream call carries: none for a trace
    /// the gateway started itself and did not sample (the service, seeing a relay without a
    /// `traceparent`, traces nothing either: `RPCTracing.startServiceCall`). Sending the ids of
    /// the 99 % of calls not sampled cost more than the budget on both sides (the header
    /// is new on every call, so HPACK cannot index it; docs/observability.md, "Cost"). A client's
    /// trace is passed on whatever its flags, as the recommendation asks.
    @inline(__always)
    static func startCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext
    ) -> (trace: TraceContext?, span: TraceSpan?) {
        let parent = RPCTracing.remoteParent(context.requestMetadata)
        let (trace, span) = RPCTracing.startServerCall(tracer, name, method, context, parent: parent)
        return (span != nil || parent != nil ? trace : nil, span)
    }
}

/// The gateway's span of every relayed call (gRPC and the browser protocols), the first of its
/// interceptors: the span covers the policy, so a call refused for its token or a rate limit is a
/// span with that status. It leaves the context the upstream call carries on the call
/// (`upstreamTrace`), where the relay finds it. Health and reflection are not traced.
struct GatewayTracing: ServerInterceptor {
    let tracer: SpanTracer
    /// The span name, made once per method (`specialized(for:)`).
    var name = ""

    static let traceKey = "gateway.upstream-trace"

    /// The trace context the upstream call carries, if any.
    static func upstreamTrace(_ context: ServerContext) -> TraceContext? { context[key: traceKey, as: TraceContext.self] }

    func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)? {
        AuthInterceptor.open.contains(method.service) ? nil : GatewayTracing(tracer: tracer, name: RPCTracing.spanName(method))
    }

    private func start(_ context: ServerContext) -> TraceSpan? {
        let (trace, span) = Proxy.startCall(tracer, name, context.method, context)
        if let trace { context[key: Self.traceKey] = trace }
        return span
    }

    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        let span = start(call.context)
        do {
            let response = try await next(call)
            RPCTracing.end(span, .ok)
            return response
        } catch {
            RPCTracing.end(span, error, call.context)
            throw error
        }
    }

    func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        guard let span = start(call.context) else { return next(call) }
        var call = call
        switch call.answer {
        case .message(let responder): call.answer = .message(SpanEndingResponder(responder, span, call.context))
        case .stream(let forwarder): call.answer = .stream(SpanEndingForwarder(forwarder, span, call.context))
        }
        return next(call)
    }
}
