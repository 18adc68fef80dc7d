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
    public static let gatewayTokenKey = "x-gateway-token"

    /// `remoteParent`, and whether the call was relayed by the gateway (it carries
    /// `x-gateway-token`): one pass over the metadata (its keys are lower-case already), the
    /// header parsed in place.
    public static func incoming(_ metadata: Metadata) -> (parent: TraceContext?, relayed: Bool) {
        var parent: String? = nil
        var state: String? = nil
        var states: [String] = []
        var relayed = false
        for e in metadata.entries {
            guard case .string(let value) = e.value else { continue }
            if e.key == "traceparent" {
                if parent == nil { parent = value }
            } else if e.key == "tracestate" {
                if state == nil { state = value } else { states.append(value) }
            } else if e.key == gatewayTokenKey {
                relayed = true
            }
        }
        guard let parent else { return (nil, relayed) }
        guard let first = state else { return (TraceContext.parse(traceparent: parent), relayed) }
        let joined = states.isEmpty ? first : ([first] + states).joined(separator: ",")
        return (TraceContext.parse(traceparent: parent, tracestate: joined), relayed)
    }

    /// The span name of a method: its path without the leading `/` (`accounts.v1.Accounts/SignUp`),
    /// as OpenTelemetry's RPC conventions name spans.
    public static func spanName(_ method: MethodDescriptor) -> String { String(method.path.dropFirst()) }

    /// A call's server span from its request metadata: its trace context, and the span itself when
    /// the trace is sampled (nil otherwise: nothing to record, nothing allocated). `name` is
    /// `spanName(method)`, made once per method. The context is noted on the call for the access
    /// log when the tracer says so.
    @inline(__always)
    public static func startServerCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext
    ) -> (trace: TraceContext, span: TraceSpan?) {
        startServerCall(tracer, name, method, context, parent: remoteParent(context.requestMetadata))
    }

    /// `startServerCall` with the parent already read from the request.
    @inline(__always)
    public static func startServerCall(
        _ tracer: SpanTracer, _ name: String, _ method: MethodDescriptor, _ context: ServerContext, parent: TraceContext?
    ) -> (trace: TraceContext, span: TraceSpan?) {
        let started = tracer.start(name, parent: parent, kind: .server)
        if let span = started.span { span.attributes = serverAttributes(method, context) }
        if tracer.notesCalls { context[key: spanKey] = started.trace }
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

    /// `startServerCall` as a span object whatever the sampling (tests, tools).
    public static func startServerSpan(_ tracer: SpanTracer, _ method: MethodDescriptor, _ context: ServerContext) -> TraceSpan {
        let span = tracer.startSpan(spanName(method), parent: remoteParent(context.requestMetadata), kind: .server)
        if span.isRecording {
            span.setAttribute("rpc.system", .string("grpc"))
            span.setAttribute("rpc.service", .string(method.service))
            span.setAttribute("rpc.method", .string(method.method))
            span.setAttribute("net.peer.address", .string(context.peerHost))
        }
        if tracer.notesCalls { context[key: spanKey] = span.trace }
        return span
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
        end(span, code(of: error, context), message: message(of: error))
    }

    /// The status code a handler's outcome becomes on the wire (as the transport maps it).
    public static func code(of error: any Error, _ context: ServerContext?) -> StatusCode { StatusCode.of(error, context) }

    static func message(of error: any Error) -> String? { (error as? RPCError)?.message }

    /// The trace context of a call's server span, if it had one (the access log's).
    public static func traceContext(of context: ServerContext?) -> TraceContext? {
        context?[key: spanKey, as: TraceContext.self]
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
        let new = tracer.newContext(parent: parent)
        var options = options
        options.metadata.set("traceparent", new.context.traceparent)
        if let state = new.context.traceState { options.metadata.set("tracestate", state) } else { options.metadata.remove("tracestate") }
        guard new.context.sampled else { return try await next(method, options) }
        let span = TraceSpan(
            tracer: tracer, base: nil, trace: new.context, parentSpanID: new.parent, name: RPCTracing.spanName(method), kind: .client,
            start: WallClock.nanoseconds())
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
    func finalStatus() async -> (status: RPCStatus, trailers: Metadata) {
        let r = await base.finalStatus()
        RPCTracing.end(span, r.status.code, message: r.status.message)
        return r
    }
    func cancel() { base.cancel() }
}

/// A forwarding handler's answer that ends the call's span first.
public final class SpanEndingResponder: UnaryResponder {
    let responder: any UnaryResponder
    let span: TraceSpan
    let context: ServerContext

    public init(_ responder: any UnaryResponder, _ span: TraceSpan, _ context: ServerContext) {
        self.responder = responder
        self.span = span
        self.context = context
    }

    public func respond(_ result: Result<[UInt8], any Error>) {
        switch result {
        case .success: RPCTracing.end(span, .ok)
        case .failure(let error): RPCTracing.end(span, error, context)
        }
        responder.respond(result)
    }
}

/// A forwarded stream's responses, ending the call's span with the call.
public final class SpanEndingForwarder: ResponseForwarder {
    let responses: any ResponseForwarder
    let span: TraceSpan
    let context: ServerContext

    public init(_ responses: any ResponseForwarder, _ span: TraceSpan, _ context: ServerContext) {
        self.responses = responses
        self.span = span
        self.context = context
    }

    public func sendHeaders() { responses.sendHeaders() }
    public func forward(_ message: [UInt8]) -> Bool { responses.forward(message) }
    public func whenWritable(_ body: @escaping @Sendable () -> Void) { responses.whenWritable(body) }
    public func end(_ result: Result<Void, any Error>) {
        switch result {
        case .success: RPCTracing.end(span, .ok)
        case .failure(let error): RPCTracing.end(span, error, context)
        }
        responses.end(result)
    }
}
