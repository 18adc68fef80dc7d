import RPCCore
import Tracing

/// Spans around gRPC calls: a server span for every call a service gets (`TracingInterceptor`: its
/// parent the caller's `traceparent`, or a new trace), made the task-local `ServiceContext` of the
/// handler; a client span for every call made through `TracingClientInterceptor` while a span is
/// current, whose context goes out as `traceparent`/`tracestate`.
///
/// Nothing here is installed when tracing is off: the interceptors are added only when a tracer
/// exists, so a process without one does no per-call work for tracing.
public enum RPCTracing {
    /// Where a call's server span is kept on its `ServerContext` (for the access log's
    /// `trace_id`/`span_id`, which is written outside the handler's task).
    public static let spanKey = "observability.trace-span"

    /// The trace context a request carries (`traceparent`, `tracestate`; several `tracestate`
    /// headers are joined with commas, as the recommendation says), or nil.
    public static func remoteParent(_ metadata: Metadata) -> TraceContext? { incoming(metadata).parent }

    /// The header a relay by the gateway carries (`HeaderPolicy`; a client cannot set it there).
    public static let gatewayTokenKey = CredentialCheck.gatewayTokenHeader

    /// `remoteParent`, and whether the call was relayed by the gateway (it carries
    /// `x-gateway-token`): one pass over the metadata (its keys are lower-case already), the
    /// header parsed in place.
    public static func incoming(_ metadata: Metadata) -> (parent: TraceContext?, relayed: Bool) {
        var parent: String? = nil
        var state: String? = nil
        var states: [String] = []
        var relayed = false
        // By index, keys first: a `for e in entries` copies (retains) every entry's value, and
        // this runs on every call the gateway relays while it traces.
        let entries = metadata.entries
        for i in entries.indices {
            let key = entries[i].key
            if key == gatewayTokenKey {
                relayed = true
                continue
            }
            guard key == "traceparent" || key == "tracestate", case .string(let value) = entries[i].value else { continue }
            if key == "traceparent" {
                if parent == nil { parent = value }
            } else {
                if state == nil { state = value } else { states.append(value) }
            }
        }
        guard let parent else { return (nil, relayed) }
        guard let first = state else { return (TraceContext.parse(traceparent: parent), relayed) }
        let joined = states.isEmpty ? first : ([first] + states).joined(separator: ",")
        return (TraceContext.parse(traceparent: parent, tracestate: joined), relayed)
    }

    /// Whether a call is one the gateway relayed without a `traceparent`, which a service does
    /// not trace (`startServiceCall`); one pass over the headers, no string made.
    public static func isUnsampledRelay(_ metadata: Metadata) -> Bool {
        // By index, keys only: a `for e in entries` copies each entry, retaining its value.
        let entries = metadata.entries
        var relayed = false
        for i in entries.indices {
            if entries[i].key == "traceparent" { return false }
            if entries[i].key == gatewayTokenKey { relayed = true }
        }
        return relayed
    }

    /// The span name of a method: its path without the leading `/` (`accounts.v1.Accounts/SignUp`),
    /// as OpenTelemetry's RPC conventions name spans.
    public static func spanName(_ method: MethodDescriptor) -> String { String(method.path.dropFirst()) }

    /// A call's server span, child of `parent` (the request's, `remoteParent`): its trace context,
    /// and the span itself when the trace is sampled (nil otherwise: nothing to record, nothing
    /// allocated). `name` is `spanName(method)`, made once per method. The context is noted on the
    /// call for the access log when the tracer says so.
    @inline(__always)
    public static func startServerCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext, parent: TraceContext?
    ) -> (trace: TraceContext, span: TraceSpan?) {
        noteServerCall(tracer, method, context, tracer.start(name, parent: parent, kind: .server))
    }

    /// `startServerCall` for the first span of a trace already drawn (`drawnRootKey`).
    static func startServerCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext, root: TraceContext
    ) -> (trace: TraceContext, span: TraceSpan?) {
        noteServerCall(tracer, method, context, tracer.start(name, root: root, kind: .server))
    }

    @inline(__always)
    static func noteServerCall(
        _ tracer: SpanTracer, _ method: MethodDescriptor, _ context: ServerContext, _ started: (trace: TraceContext, span: TraceSpan?)
    ) -> (trace: TraceContext, span: TraceSpan?) {
        if let span = started.span { span.attributes = serverAttributes(method, context) }
        if tracer.notesCalls { context.setValue(started.trace, forKey: spanKey) }
        return started
    }

    /// A service's call: `startServerCall`, or nil for a call the gateway relayed without a
    /// `traceparent` (a trace the gateway started and did not sample: it sends no header for
    /// those, docs/observability.md, "Cost"). Such a call is not traced at all: no span, no
    /// trace context bound around the handler, nothing noted for the access log.
    @inline(__always)
    public static func startServiceCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext
    ) -> (trace: TraceContext, span: TraceSpan?)? {
        let (parent, relayed) = incoming(context.requestMetadata)
        if parent == nil && relayed { return nil }
        return startServerCall(tracer, name, method, context, parent: parent)
    }

    /// A server span's attributes, made at once (one dictionary with room for the status code
    /// added at the end, set under one lock) rather than one `setAttribute` at a time.
    static func serverAttributes(_ method: MethodDescriptor, _ context: ServerContext) -> SpanAttributes {
        var a = [String: SpanAttribute](minimumCapacity: 6)
        a["rpc.system"] = .string("grpc")
        a["rpc.service"] = .string(method.service)
        a["rpc.method"] = .string(method.method)
        a["net.peer.address"] = .string(context.peerHost)
        return SpanAttributes(a)
    }

    /// Ends a call's span with its status code (`rpc.grpc.status_code`). A server span is an
    /// error only for the codes that say the server failed (OpenTelemetry's gRPC rule: UNKNOWN,
    /// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS); a client span for
    /// every code but OK. Nil (not sampled): nothing to do.
    public static func end(_ span: TraceSpan?, _ code: StatusCode, message: String? = nil) {
        guard let span else { return }
        if span.isRecording {
            span.setAttribute("rpc.grpc.status_code", .int64(Int64(code.rawValue)))
            let failed: Bool
            if span.kind == .server {
                switch code {
                case .unknown, .deadlineExceeded, .unimplemented, .internal, .unavailable, .dataLoss: failed = true
                default: failed = false
                }
            } else {
                failed = code != .ok
            }
            if failed { span.setStatus(SpanStatus(code: .error, message: message.map { String($0.prefix(256)) } ?? code.name)) }
        }
        span.end()
    }

    /// Ends a call's span with the outcome of its handler.
    public static func end(_ span: TraceSpan?, _ error: any Error, _ context: ServerContext?) {
        guard let span else { return }
        end(span, StatusCode.of(error, context), message: message(of: error))
    }

    /// Ends a call's span with its outcome.
    public static func end<T>(_ span: TraceSpan?, _ result: Result<T, any Error>, _ context: ServerContext?) {
        switch result {
        case .success: end(span, .ok)
        case .failure(let error): end(span, error, context)
        }
    }

    /// A forwarded call's answer that ends `span` with the call, before answering.
    public static func ending(_ answer: ForwardedCall.Answer, _ span: TraceSpan, _ context: ServerContext) -> ForwardedCall.Answer {
        switch answer {
        case .message(let responder):
            .message(
                ClosureResponder { result in
                    end(span, result, context)
                    responder.respond(result)
                })
        case .stream(let forwarder):
            .stream(ObservedForwarder(forwarder) { result in end(span, result, context) })
        }
    }

    /// Where a relay's call notes the trace context its upstream call carries.
    static let upstreamTraceKey = "observability.upstream-trace"

    /// A relay's call (the gateway's): its server span, child of the client's `traceparent` or the
    /// root of a new trace; the context the upstream call is to carry is noted on the call
    /// (`upstreamTrace`): none for a trace the relay started itself and did not sample (the
    /// service, seeing a relay without a `traceparent`, traces nothing either:
    /// `startServiceCall`). Sending the ids of the 99 % of calls not sampled cost more than the
    /// issue's budget on both sides (the header is new on every call, so HPACK cannot index it;
    /// docs/observability.md, "Cost"). A client's trace is passed on whatever its flags, as the
    /// recommendation asks.
    public static func startRelayCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext
    ) -> TraceSpan? {
        let parent = remoteParent(context.requestMetadata)
        let (trace, span): (TraceContext, TraceSpan?)
        if parent == nil, let drawn = context.value(forKey: drawnRootKey) as? TraceContext {
            // The relay's gate drew this call's new trace (sampled: else it relayed the call).
            (trace, span) = startServerCall(tracer, name, method, context, root: drawn)
        } else {
            (trace, span) = startServerCall(tracer, name, method, context, parent: parent)
        }
        if span != nil || parent != nil { context.setValue(trace, forKey: upstreamTraceKey) }
        return span
    }

    /// A new trace a relay's gate drew for a call with no `traceparent` and sent through the
    /// chain because it is sampled (`TracingInterceptor.relayPart`): the call's span starts it,
    /// so the sampling is drawn once.
    static let drawnRootKey = "observability.drawn-root"

    /// The trace context a relayed call's upstream call carries (`startRelayCall`), if any.
    public static func upstreamTrace(_ context: ServerContext) -> TraceContext? {
        context.value(forKey: upstreamTraceKey) as? TraceContext
    }

    static func message(of error: any Error) -> String? { (error as? RPCError)?.message }

    /// The trace context of a call's server span, if it had one (the access log's).
    public static func traceContext(of context: ServerContext?) -> TraceContext? {
        context?.value(forKey: spanKey) as? TraceContext
    }
}

/// A client interceptor that makes every call started while a span is current (a handler's, an
/// outbox delivery's) a client span, child of it, and sends its context as `traceparent` and
/// `tracestate`. A call started with no current trace goes out as it is.
public struct TracingClientInterceptor: ClientInterceptor {
    public let tracer: SpanTracer

    public init(tracer: SpanTracer) {
        self.tracer = tracer
    }

    public func intercept(
        _ method: MethodDescriptor, _ options: CallOptions, next: ClientInterceptors.Next
    ) async throws
        -> any RawClientCall
    {
        guard let parent = TraceContext.current else {
            return try await next(method, options)
        }
        // Not sampled: only the ids go on (no span object, nothing recorded).
        let (trace, span) = tracer.start(RPCTracing.spanName(method), parent: parent, kind: .client)
        var options = options
        options.metadata.set("traceparent", trace.traceparent)
        if let state = trace.traceState { options.metadata.set("tracestate", state) } else { options.metadata.remove("tracestate") }
        guard let span else { return try await next(method, options) }
        span.setAttribute("rpc.system", .string("grpc"))
        span.setAttribute("rpc.service", .string(method.service))
        span.setAttribute("rpc.method", .string(method.method))
        do {
            return TracedClientCall(base: try await next(method, options), span: span)
        } catch {
            RPCTracing.end(span, error, nil)
            throw error
        }
    }
}

/// A client call whose span ends with its final status (or, if nobody asks for the status,
/// when the call is released).
final class TracedClientCall: RawClientCall {
    let base: any RawClientCall
    let span: TraceSpan

    init(base: any RawClientCall, span: TraceSpan) {
        self.base = base
        self.span = span
    }

    deinit { span.end() }

    func send(_ message: [UInt8], compress: Bool) async throws { try await base.send(message, compress: compress) }
    func closeSend() async throws { try await base.closeSend() }
    func initialMetadata() async throws -> Metadata { try await base.initialMetadata() }
    var responses: RawMessageStream { base.responses }
    var statusCameFromPeer: Bool { base.statusCameFromPeer }
    func finalStatus() async -> (status: RPCStatus, trailers: Metadata) {
        let r = await base.finalStatus()
        RPCTracing.end(span, r.status.code, message: r.status.message)
        return r
    }
    func cancel() { base.cancel() }
}
