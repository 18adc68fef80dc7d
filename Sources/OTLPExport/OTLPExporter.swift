import Foundation
import Logging
import OTLPContracts
import Observability
import RPCCore
import RPCTLS
import RPCTransport
import Synchronization
import Tracing

/// Sends spans to an OpenTelemetry collector (or any OTLP/gRPC receiver) with
/// `opentelemetry.proto.collector.trace.v1.TraceService/Export`, over our own client runtime
/// (`RPCChannel`, h2c or TLS) and the generated OTLP types (`OTLPContracts`).
///
/// Spans wait in a bounded buffer (`capacity`, 8192: past it new spans are dropped and counted in
/// `tracing_spans_dropped_total`); a thread of its own sends them, `batch` (512) per Export, every
/// `interval` (1 s) or as soon as a batch is waiting. Each Export is one unary call with a short
/// deadline (`timeout`, 5 s); UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED and ABORTED are
/// tried again (`attempts` in all, backoff doubling from `initialBackoff`), then the batch is
/// dropped and counted, as is a batch the collector refuses with another status and the spans a
/// `partial_success` says it rejected. So a collector that is down or slow costs the traced calls
/// nothing: `export` only appends under a lock, and what cannot be sent is counted and dropped.
///
/// The exporter's own calls are not traced: its channel has no interceptors and its thread no
/// trace context. `shutdown()` sends what is buffered, waiting `shutdownTimeout` at most.
public final class OTLPExporter: SpanExporter {
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        /// TLS towards the collector (nil: h2c).
        public var tls: TLSConfiguration?
        public var capacity = 8192
        public var batch = 512
        public var interval: Duration = .seconds(1)
        /// The deadline of one Export call.
        public var timeout: Duration = .seconds(5)
        /// Tries of one batch in all (the first and the retries of a retryable failure).
        public var attempts = 4
        public var initialBackoff: Duration = .milliseconds(200)
        public var maxBackoff: Duration = .seconds(2)
        /// How long `shutdown()` waits for the buffered spans to be sent.
        public var shutdownTimeout: Duration = .seconds(5)

        public init(host: String, port: Int, tls: TLSConfiguration? = nil) {
            self.host = host
            self.port = port
            self.tls = tls
        }
    }

    public let configuration: Configuration
    private let channel: RPCChannel
    private let resource: Opentelemetry_Proto_Resource_V1_Resource
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let stopped = DispatchSemaphore(value: 0)
    private let dropped = TracingMetrics.spansDropped
    /// Whether the last batch failed (only the sender thread touches it): a failure is logged
    /// when it begins, with the collector's status, and again when exports work again, not per
    /// batch.
    private nonisolated(unsafe) var failing = false

    private struct State {
        var spans: [SpanRecord] = []
        var stopping = false
        /// When stopping: the time by which the last spans must be sent (or dropped).
        var deadline: ContinuousClock.Instant?
        var flushWaiters: [DispatchSemaphore] = []
    }

    /// The statuses after which a batch is sent again (OTLP's retryable gRPC codes).
    public static let retryable: Set<StatusCode> = [.unavailable, .deadlineExceeded, .resourceExhausted, .aborted]

    public init(configuration: Configuration, serviceName: String) {
        var configuration = configuration
        // A batch of none would never send, and a buffer smaller than a batch never fills one.
        configuration.batch = max(1, configuration.batch)
        configuration.capacity = max(configuration.batch, configuration.capacity)
        self.configuration = configuration
        var channel = ChannelConfiguration(host: configuration.host, port: configuration.port, tls: configuration.tls)
        // A collector that is down is noticed at once (connection refused) or within a second
        // (no answer), and not retried for long: the batch retries are the exporter's.
        channel.connectTimeout = .seconds(1)
        channel.initialBackoff = .milliseconds(100)
        channel.maxBackoff = .seconds(1)
        // A collector that vanishes without closing the connection (its pod killed, its link
        // cut) is found by a PING left unanswered while an Export waits, as peers are: not only
        // after four timed-out tries of every batch until the kernel gives the connection up.
        channel.keepaliveTime = .seconds(10)
        channel.keepaliveTimeout = .seconds(5)
        self.channel = RPCChannel(configuration: channel)
        var r = Opentelemetry_Proto_Resource_V1_Resource()
        r.attributes = [Self.keyValue("service.name", .string(serviceName))]
        resource = r
        let thread = Thread { [self] in senderLoop() }
        thread.name = "otlp-exporter"
        thread.start()
    }

    /// The exporter for `TRACE_EXPORT=otlp://` or `otlps://`: TLS with `clusterTLS` (the trust
    /// roots and client certificate the process uses for its peers) when there is one, else with
    /// the system's trust store.
    public convenience init(endpoint: OTLPEndpoint, serviceName: String, clusterTLS: TLSConfiguration?) throws {
        var tls: TLSConfiguration?
        if endpoint.tls {
            do { tls = try clusterTLS ?? TLSConfiguration.client(alpn: ["h2"], serverName: nil) } catch {
                throw TracingSettingsError("TRACE_EXPORT=\(endpoint): TLS: \(error)")
            }
        }
        self.init(configuration: Configuration(host: endpoint.host, port: endpoint.port, tls: tls), serviceName: serviceName)
    }

    // MARK: SpanExporter

    public func export(_ span: SpanRecord) {
        let (accepted, full) = state.withLock { s -> (Bool, Bool) in
            guard !s.stopping, s.spans.count < configuration.capacity else { return (false, false) }
            s.spans.append(span)
            return (true, s.spans.count == configuration.batch)
        }
        if !accepted { dropped.increment() }
        if full { wake.signal() }
    }

    /// Sends what is buffered now; returns when it is sent (or dropped after its retries).
    public func flush() {
        let done = DispatchSemaphore(value: 0)
        let running = state.withLock { s -> Bool in
            guard !s.stopping else { return false }
            s.flushWaiters.append(done)
            return true
        }
        guard running else { return }
        wake.signal()
        done.wait()
    }

    /// Sends what is buffered (for `shutdownTimeout` at most: what is left then is dropped and
    /// counted) and closes the connection. Later spans are dropped.
    public func shutdown() {
        let limit = configuration.shutdownTimeout
        let first = state.withLock { s -> Bool in
            defer { s.stopping = true }
            if !s.stopping { s.deadline = .now + limit }
            return !s.stopping
        }
        guard first else { return }
        wake.signal()
        // The sender keeps to the deadline; the margin covers a call that ends late.
        _ = stopped.wait(timeout: .now() + .nanoseconds((limit + .seconds(2)).wholeNanoseconds))
    }

    // MARK: Sending

    private func senderLoop() {
        let interval = configuration.interval.wholeNanoseconds
        while true {
            _ = wake.wait(timeout: .now() + .nanoseconds(interval))
            let (waiters, stopping, pending) = state.withLock { s in
                defer { s.flushWaiters = [] }
                return (s.flushWaiters, s.stopping, s.spans.count)
            }
            // Batch after batch, `batch` spans taken at a time (so the buffer's bound holds while
            // one is on its way), until what was buffered at the start of this round is sent: a
            // flush waits for the spans it asked for, not for a buffer that new spans keep full.
            var left = pending
            while left > 0 || stopping {
                let spans = state.withLock { s -> [SpanRecord] in
                    let n = min(configuration.batch, s.spans.count)
                    guard n > 0 else { return [] }
                    let taken = Array(s.spans[..<n])
                    s.spans.removeFirst(n)
                    return taken
                }
                if spans.isEmpty { break }
                left -= spans.count
                send(spans)
            }
            for w in waiters { w.signal() }
            if stopping {
                let closed = DispatchSemaphore(value: 0)
                let channel = self.channel
                Task {
                    await channel.close()
                    closed.signal()
                }
                _ = closed.wait(timeout: .now() + .seconds(2))
                stopped.signal()
                return
            }
        }
    }

    /// One batch: Export, tried again on a retryable status; the spans not accepted are counted.
    /// Once `shutdown()` has begun, every try keeps to its deadline (a batch on its way then too).
    private func send(_ spans: [SpanRecord]) {
        // Past the shutdown's deadline the batch is dropped without being encoded.
        if let deadline = state.withLock({ $0.deadline }), deadline <= .now {
            dropped.increment(by: Int64(spans.count))
            return
        }
        let request = makeRequest(spans).serializedBytes()
        var last: (code: StatusCode, message: String)? = nil
        var backoff = configuration.initialBackoff
        for attempt in 1...max(1, configuration.attempts) {
            var timeout = configuration.timeout
            let deadline = state.withLock { $0.deadline }
            if let deadline {
                let left = deadline - .now
                if left <= .zero { break }
                timeout = min(timeout, left)
            }
            let result = call(request, timeout: timeout)
            last = (result.code, result.message)
            if result.code == .ok {
                if failing {
                    failing = false
                    Self.logger.info("OTLP export to \(configuration.host):\(configuration.port) works again")
                }
                var rejected = 0
                if let bytes = result.response,
                    let response = try? Opentelemetry_Proto_Collector_Trace_V1_ExportTraceServiceResponse(serializedBytes: bytes),
                    response.hasPartialSuccess
                {
                    rejected = Int(clamping: max(0, min(response.partialSuccess.rejectedSpans, Int64(spans.count))))
                }
                if rejected > 0 { dropped.increment(by: Int64(rejected)) }
                return
            }
            guard Self.retryable.contains(result.code), attempt < configuration.attempts else { break }
            // Full jitter on the backoff, so that processes a collector dropped do not return together.
            var pause = Duration.nanoseconds(Int64.random(in: 0...max(1, Int64(backoff.wholeNanoseconds))))
            if let deadline { pause = min(pause, max(.zero, deadline - .now)) }
            Thread.sleep(forTimeInterval: pause.inSeconds)
            backoff = min(backoff * 2, configuration.maxBackoff)
        }
        dropped.increment(by: Int64(spans.count))
        if !failing {
            failing = true
            Self.logger.warning(
                "OTLP export to \(configuration.host):\(configuration.port) failed: \(last.map { "\($0.code.name): \($0.message)" } ?? "the shutdown deadline passed before a try"); spans are dropped (counted in tracing_spans_dropped_total) until it works again"
            )
        }
    }

    /// Made when used (rarely: a failure or a recovery), so never before logging is bootstrapped
    /// (the exporter is made before it).
    private static var logger: Logger { Logger(label: "otlp-exporter") }

    /// One unary Export without a task: the sender thread waits for it (never a traced call's).
    private func call(_ request: [UInt8], timeout: Duration) -> (code: StatusCode, message: String, response: [UInt8]?) {
        let call = ExportCall(request: request)
        channel.start(call, Opentelemetry_Proto_Collector_Trace_V1_TraceServiceMethods.export, options: CallOptions(timeout: timeout))
        // The call ends by its deadline (the margin only guards against one that never ends), or
        // when the shutdown's time is up, even if it began before the shutdown did.
        let end = ContinuousClock.now + timeout + .seconds(1)
        while call.done.wait(timeout: .now() + .milliseconds(100)) == .timedOut {
            let now = ContinuousClock.now
            if now >= end || state.withLock({ s in s.deadline.map { now >= $0 } ?? false }) {
                call.cancel()
                return (.deadlineExceeded, "no answer within \(timeout)", nil)
            }
        }
        return call.result.withLock { $0 } ?? (.unknown, "no result", nil)
    }

    private final class ExportCall: PendingUnaryCall, @unchecked Sendable {
        let done = DispatchSemaphore(value: 0)
        let result = Mutex<(code: StatusCode, message: String, response: [UInt8]?)?>(nil)
        override func completed(_ r: consuming UnaryCallResult) {
            result.withLock { $0 = (r.status.code, r.status.message, r.response) }
            done.signal()
        }
    }

    // MARK: Spans as OTLP

    /// The Export request for `spans`: one resource (this process: `service.name`), one scope.
    func makeRequest(_ spans: [SpanRecord]) -> Opentelemetry_Proto_Collector_Trace_V1_ExportTraceServiceRequest {
        var scope = Opentelemetry_Proto_Trace_V1_ScopeSpans()
        scope.spans = spans.map(Self.span)
        var rs = Opentelemetry_Proto_Trace_V1_ResourceSpans()
        rs.resource = resource
        rs.scopeSpans = [scope]
        var request = Opentelemetry_Proto_Collector_Trace_V1_ExportTraceServiceRequest()
        request.resourceSpans = [rs]
        return request
    }

    /// A span as OTLP has it, field by field as the span file writes it (`SpanJSON`).
    public static func span(_ record: SpanRecord) -> Opentelemetry_Proto_Trace_V1_Span {
        var s = Opentelemetry_Proto_Trace_V1_Span()
        s.traceId = traceID(record.trace.traceIDHigh, record.trace.traceIDLow)
        s.spanId = bytes(record.trace.spanID)
        if let parent = record.parentSpanID { s.parentSpanId = bytes(parent) }
        s.traceState = record.trace.traceState ?? ""
        s.flags = UInt32(record.trace.flags)
        s.name = record.name
        s.kind = kind(record.kind)
        s.startTimeUnixNano = record.startNanoseconds
        s.endTimeUnixNano = record.endNanoseconds
        s.attributes = attributes(record.attributes)
        s.events = record.events.map { e in
            var event = Opentelemetry_Proto_Trace_V1_Span.Event()
            event.timeUnixNano = e.nanosecondsSinceEpoch
            event.name = e.name
            event.attributes = attributes(e.attributes)
            return event
        }
        s.links = record.links.map { l in
            var link = Opentelemetry_Proto_Trace_V1_Span.Link()
            link.traceId = traceID(l.traceIDHigh, l.traceIDLow)
            link.spanId = bytes(l.spanID)
            link.traceState = l.traceState ?? ""
            link.flags = UInt32(l.flags)
            return link
        }
        if let status = record.status {
            var st = Opentelemetry_Proto_Trace_V1_Status()
            st.code = status.code == .ok ? .ok : .error
            st.message = status.message ?? ""
            s.status = st
        }
        return s
    }

    static func kind(_ kind: SpanKind) -> Opentelemetry_Proto_Trace_V1_Span.SpanKind {
        switch kind {
        case .internal: .internal
        case .server: .server
        case .client: .client
        case .producer: .producer
        case .consumer: .consumer
        }
    }

    /// 16 bytes, big-endian (the order of the hex in `traceparent`).
    static func traceID(_ high: UInt64, _ low: UInt64) -> [UInt8] { bytes(high) + bytes(low) }

    /// 8 bytes, big-endian.
    static func bytes(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) } }

    static func attributes(_ attributes: SpanAttributes) -> [Opentelemetry_Proto_Common_V1_KeyValue] {
        var out: [Opentelemetry_Proto_Common_V1_KeyValue] = []
        attributes.forEach { key, value in out.append(keyValue(key, value)) }
        out.sort { $0.key < $1.key }
        return out
    }

    static func keyValue(_ key: String, _ value: SpanAttribute) -> Opentelemetry_Proto_Common_V1_KeyValue {
        var kv = Opentelemetry_Proto_Common_V1_KeyValue()
        kv.key = key
        kv.value = anyValue(value)
        return kv
    }

    static func anyValue(_ value: SpanAttribute) -> Opentelemetry_Proto_Common_V1_AnyValue {
        func array(_ items: [SpanAttribute]) -> Opentelemetry_Proto_Common_V1_AnyValue.OneOf_Value {
            var a = Opentelemetry_Proto_Common_V1_ArrayValue()
            a.values = items.map(anyValue)
            return .arrayValue(a)
        }
        var v = Opentelemetry_Proto_Common_V1_AnyValue()
        switch value {
        case .int32(let i): v.value = .intValue(Int64(i))
        case .int64(let i): v.value = .intValue(i)
        case .double(let d): v.value = .doubleValue(d)
        case .bool(let b): v.value = .boolValue(b)
        case .string(let s): v.value = .stringValue(s)
        case .int32Array(let a): v.value = array(a.map { .int32($0) })
        case .int64Array(let a): v.value = array(a.map { .int64($0) })
        case .doubleArray(let a): v.value = array(a.map { .double($0) })
        case .boolArray(let a): v.value = array(a.map { .bool($0) })
        case .stringArray(let a): v.value = array(a.map { .string($0) })
        case .stringConvertibleArray(let a): v.value = array(a.map { .string($0.description) })
        case .stringConvertible(let c): v.value = .stringValue(c.description)
        default: v.value = .stringValue("")
        }
        return v
    }
}
