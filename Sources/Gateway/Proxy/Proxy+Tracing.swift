import Observability
import RPCCore

/// Relayed calls as spans, when the gateway traces (`TRACE_EXPORT`): each call is a server span
/// whose parent is the client's `traceparent` (or, with none or a malformed one, the first span of
/// a new trace, sampled at `TRACE_SAMPLE_RATIO`), and the upstream call carries this span's
/// context as its `traceparent` (and the client's `tracestate`), so the service's span is its
/// child. The handlers are chosen once, when the routes are built: with tracing off none of this
/// exists and a relayed call does nothing for it. An unsampled call has no span: it only carries
/// the client's trace up (a trace the gateway started and did not sample is not sent up at all,
/// `startCall`); a sampled one's span ends with the call, through a responder or forwarder that
/// wraps the client's stream.
extension Proxy {
    func tracedHandler(for method: MethodDescriptor, tracer: SpanTracer) -> RawHandler {
        let name = RPCTracing.spanName(method)
        switch method.kind {
        case .unary:
            return .unaryForwarding { request, context, responder in
                let (trace, span) = Self.startCall(tracer, name, method, context)
                guard let span else { return unary(method, request, context, responder, trace: trace) }
                return unary(method, request, context, SpanEndingResponder(responder, span, context), trace: trace)
            }
        case .serverStreaming:
            return .serverStreamingForwarding { request, context, responses in
                let (trace, span) = Self.startCall(tracer, name, method, context)
                guard let span else { return serverStreaming(method, request, context, responses, trace: trace) }
                return serverStreaming(method, request, context, SpanEndingForwarder(responses, span, context), trace: trace)
            }
        case .clientStreaming, .bidirectionalStreaming:
            return .bidirectionalStreaming { requests, sink, context in
                let (trace, span) = Self.startCall(tracer, name, method, context)
                do {
                    try await streaming(method, requests, sink, context, trace: trace)
                    RPCTracing.end(span, .ok)
                } catch {
                    RPCTracing.end(span, error, context)
                    throw error
                }
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
