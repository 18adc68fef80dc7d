import Foundation
import Synchronization
import Tracing

/// Our tracer, behind swift-distributed-tracing's `Tracer` protocol: W3C trace context, a ratio
/// sampler for new traces (parent-based for the rest), and finished sampled spans handed to an
/// exporter (`SpanExporter`: a file of JSON lines).
///
/// Spans that are not sampled still get ids and carry the context on (so a trace a caller
/// sampled keeps its flags downstream), but record nothing and are never exported.
public final class SpanTracer: Tracer, Sendable {
    public typealias Span = TraceSpan

    /// The process's name, written with every span (`resource` `service.name`).
    public let serviceName: String
    public let sampler: RatioSampler
    let ids: TraceIDGenerator
    let exporter: (any SpanExporter)?
    /// Whether a call's server span is noted on its `ServerContext` for the access log (which is
    /// written outside the handler's task); off when the process writes no access log.
    public let notesCalls: Bool

    public init(
        serviceName: String, sampler: RatioSampler, exporter: (any SpanExporter)?, ids: TraceIDGenerator = TraceIDGenerator(),
        notesCalls: Bool = true
    ) {
        self.serviceName = serviceName
        self.sampler = sampler
        self.exporter = exporter
        self.ids = ids
        self.notesCalls = notesCalls
    }

    // MARK: Tracer

    public func startSpan<Instant: TracerInstant>(
        _ operationName: String, context: @autoclosure () -> ServiceContext, ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant, function: String, file fileID: String, line: UInt
    ) -> TraceSpan {
        let context = context()
        // The parent: the context's span, or, with none, the handler's (`TraceContext.withCurrent`).
        let span = newContext(parent: context.traceContext ?? TraceTaskLocal.context)
        return TraceSpan(
            tracer: self, base: context, trace: span.context, parentSpanID: span.parent, name: operationName, kind: kind,
            start: instant().nanosecondsSinceEpoch)
    }

    /// A span whose parent is `parent` (nil: the root of a new trace), started now, whatever the
    /// sampling (a span object that records only when sampled; tools and tests). The RPC paths use
    /// `start`, which makes no span for an unsampled trace.
    public func startSpan(_ name: String, parent: TraceContext?, kind: SpanKind) -> TraceSpan {
        let span = newContext(parent: parent)
        return TraceSpan(
            tracer: self, base: nil, trace: span.context, parentSpanID: span.parent, name: name, kind: kind, start: WallClock.nanoseconds())
    }

    /// A span if the trace is sampled, else only the context a span would have (ids and flags, to
    /// pass on): what most calls need at 1 %, with nothing allocated (`name` is made only for a
    /// span). `span` is nil then.
    @inline(__always)
    public func start(_ name: @autoclosure () -> String, parent: TraceContext?, kind: SpanKind) -> (trace: TraceContext, span: TraceSpan?) {
        let new = newContext(parent: parent)
        guard new.context.sampled else { return (new.context, nil) }
        let span = TraceSpan(
            tracer: self, base: nil, trace: new.context, parentSpanID: new.parent, name: name(), kind: kind, start: WallClock.nanoseconds())
        return (new.context, span)
    }

    /// `start` for the first span of a new trace whose ids and sampling were drawn already
    /// (`newRoot`): the span when it is sampled.
    public func start(_ name: @autoclosure () -> String, root: TraceContext, kind: SpanKind) -> (trace: TraceContext, span: TraceSpan?) {
        guard root.sampled else { return (root, nil) }
        return (root, TraceSpan(tracer: self, base: nil, trace: root, parentSpanID: nil, name: name(), kind: kind, start: WallClock.nanoseconds()))
    }

    /// The ids and sampling of a new trace, drawn as `start` draws them for a span with no parent.
    @inline(__always)
    public func newRoot() -> TraceContext { newContext(parent: nil).context }

    /// The context of a new span: a child of `parent` (same trace, its flags, its tracestate), or
    /// the first span of a new trace, sampled by the ratio.
    @inline(__always)
    func newContext(parent: TraceContext?) -> (context: TraceContext, parent: UInt64?) {
        if var c = parent {
            let parentID = c.spanID
            c.spanID = ids.next()
            return (c, parentID)
        }
        let (high, low, span) = ids.nextThree()
        return (TraceContext(traceIDHigh: high, traceIDLow: low, spanID: span, sampled: sampler.samples(traceIDLow: low)), nil)
    }

    public func forceFlush() { exporter?.flush() }

    /// Flushes and stops the exporter (process shutdown).
    public func shutdown() { exporter?.shutdown() }

    // MARK: Instrument: the W3C headers in and out of any carrier

    public func extract<Carrier, Extract: Extractor>(_ carrier: Carrier, into context: inout ServiceContext, using extractor: Extract)
    where Extract.Carrier == Carrier {
        if let c = TraceContext.parse(
            traceparent: extractor.extract(key: "traceparent", from: carrier),
            tracestate: extractor.extract(key: "tracestate", from: carrier))
        {
            context.traceContext = c
        }
    }

    public func inject<Carrier, Inject: Injector>(_ context: ServiceContext, into carrier: inout Carrier, using injector: Inject)
    where Inject.Carrier == Carrier {
        guard let c = context.traceContext else { return }
        injector.inject(c.traceparent, forKey: "traceparent", into: &carrier)
        if let state = c.traceState { injector.inject(state, forKey: "tracestate", into: &carrier) }
    }

    func finished(_ record: SpanRecord) {
        exporter?.export(record)
    }
}

/// One span of `SpanTracer`. Thread-safe; ends once (later `end` calls do nothing). Only a
/// sampled span records attributes, events and links, and only it is exported.
public final class TraceSpan: Tracing.Span, Sendable {
    /// The context the span was started in, if any (other values it carries are kept).
    private let base: ServiceContext?
    public let trace: TraceContext
    public let parentSpanID: UInt64?
    public let kind: SpanKind
    let startNanoseconds: UInt64
    private let tracer: SpanTracer
    private let state: Mutex<State>

    struct State {
        var name: String
        var attributes = SpanAttributes()
        var status: SpanStatus?
        var events: [SpanEvent] = []
        var links: [TraceContext] = []
        var ended = false
    }

    init(tracer: SpanTracer, base: ServiceContext?, trace: TraceContext, parentSpanID: UInt64?, name: String, kind: SpanKind, start: UInt64) {
        self.tracer = tracer
        self.base = base
        self.trace = trace
        self.parentSpanID = parentSpanID
        self.kind = kind
        self.startNanoseconds = start
        self.state = Mutex(State(name: name))
    }

    public var isRecording: Bool { trace.sampled }

    /// The span's `ServiceContext`: the one it was started in with this span's trace context.
    public var context: ServiceContext {
        var c = base ?? .topLevel
        c.traceContext = trace
        return c
    }

    public var operationName: String {
        get { state.withLock { $0.name } }
        set { state.withLock { $0.name = newValue } }
    }

    public var attributes: SpanAttributes {
        get { state.withLock { $0.attributes } }
        set {
            guard isRecording else { return }
            state.withLock { $0.attributes = newValue }
        }
    }

    /// Sets one attribute (no copy of the others).
    public func setAttribute(_ key: String, _ value: SpanAttribute) {
        guard isRecording else { return }
        state.withLock { $0.attributes.set(key, value: value) }
    }

    public func setStatus(_ status: SpanStatus) {
        guard isRecording else { return }
        state.withLock { s in
            // OK is final; an error may be replaced by OK, as OpenTelemetry's rule has it.
            if s.status?.code != .ok { s.status = status }
        }
    }

    public func addEvent(_ event: SpanEvent) {
        guard isRecording else { return }
        state.withLock { $0.events.append(event) }
    }

    public func recordError<Instant: TracerInstant>(_ error: any Error, attributes: SpanAttributes, at instant: @autoclosure () -> Instant) {
        guard isRecording else { return }
        var a = attributes
        a.set("exception.type", value: .string(String(reflecting: type(of: error))))
        a.set("exception.message", value: .string(String(String(describing: error).prefix(1000))))
        addEvent(SpanEvent(name: "exception", at: instant(), attributes: a))
    }

    public func addLink(_ link: SpanLink) {
        guard isRecording, let other = link.context.traceContext else { return }
        state.withLock { $0.links.append(other) }
    }

    public func end<Instant: TracerInstant>(at instant: @autoclosure () -> Instant) {
        end(nanoseconds: instant().nanosecondsSinceEpoch)
    }

    /// Ends the span now (the RPC wrappers' form).
    public func end() { end(nanoseconds: WallClock.nanoseconds()) }

    func end(nanoseconds: UInt64) {
        let record = state.withLock { s -> SpanRecord? in
            guard !s.ended else { return nil }
            s.ended = true
            guard trace.sampled else { return nil }
            return SpanRecord(
                trace: trace, parentSpanID: parentSpanID, name: s.name, kind: kind, startNanoseconds: startNanoseconds,
                endNanoseconds: max(nanoseconds, startNanoseconds), attributes: s.attributes, status: s.status, events: s.events,
                links: s.links)
        }
        if let record { tracer.finished(record) }
    }
}

/// A finished span, as exporters receive it.
public struct SpanRecord: Sendable {
    public var trace: TraceContext
    public var parentSpanID: UInt64?
    public var name: String
    public var kind: SpanKind
    public var startNanoseconds: UInt64
    public var endNanoseconds: UInt64
    public var attributes: SpanAttributes
    public var status: SpanStatus?
    public var events: [SpanEvent]
    public var links: [TraceContext]
}

/// Wall-clock nanoseconds since the Unix epoch (span times are wall-clock, as OTLP's are).
enum WallClock {
    @inline(__always)
    static func nanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }
}
