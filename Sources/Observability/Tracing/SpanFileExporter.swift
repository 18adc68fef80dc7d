import Foundation
import Prometheus
import Synchronization
import Tracing

/// Where finished spans go.
public protocol SpanExporter: Sendable {
    /// Takes a finished span; must not block (called where the span ends: a handler, an event loop).
    func export(_ span: SpanRecord)
    /// Writes out what is buffered now and returns when it is written.
    func flush()
    /// Flushes and stops; later spans are dropped.
    func shutdown()
}

/// Writes spans to a file, one JSON object per span per line, in OpenTelemetry's OTLP/JSON
/// field names (a line is one OTLP `Span` plus its `resource`):
///
/// ```
/// {"traceId":"4bf9…4736","spanId":"00f0…02b7","parentSpanId":"…","name":"accounts.v1.Accounts/SignUp","kind":2,
///  "startTimeUnixNano":"1764…","endTimeUnixNano":"1764…","attributes":[{"key":"rpc.system","value":{"stringValue":"grpc"}},…],
///  "status":{"code":1},"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"accounts"}}]}}
/// ```
///
/// `kind` and `status.code` are OTLP's numbers (kind 1 internal, 2 server, 3 client, 4 producer,
/// 5 consumer; status 0 unset, 1 ok, 2 error); 64-bit times are strings, as OTLP/JSON writes
/// them; `parentSpanId` is absent on a trace's first span.
///
/// Spans wait in a bounded buffer (`capacity`; past it new spans are dropped and counted in
/// `tracing_spans_dropped_total`) and a thread of its own writes them, every `interval` or as
/// soon as `batch` are waiting, each batch with one `write(2)` in append mode: never on an event
/// loop or a request's task, and several processes may share one file (lines do not interleave).
/// `shutdown()` writes what is left.
public final class SpanFileExporter: SpanExporter {
    public let path: String
    private let fd: Int32
    private let capacity: Int
    private let batch: Int
    private let interval: Duration
    private let resourceJSON: [UInt8]
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let stopped = DispatchSemaphore(value: 0)
    private let output: LogOutput
    private let dropped = TracingMetrics.spansDropped

    private struct State {
        var spans: [SpanRecord] = []
        var stopping = false
        var flushWaiters: [DispatchSemaphore] = []
    }

    /// Opens (creates, appends to) `path`; throws when it cannot.
    public init(path: String, serviceName: String, capacity: Int = 8192, batch: Int = 512, interval: Duration = .seconds(1)) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw TracingSettingsError("cannot open the span file '\(path)': \(String(cString: strerror(errno)))")
        }
        self.path = path
        self.fd = fd
        self.output = LogOutput(fileDescriptor: fd)
        self.capacity = max(1, capacity)
        self.batch = max(1, batch)
        self.interval = interval
        var r = [UInt8]()
        SpanJSON.appendResource(serviceName: serviceName, to: &r)
        resourceJSON = r
        let thread = Thread { [self] in writerLoop() }
        thread.name = "span-exporter"
        thread.start()
    }

    public func export(_ span: SpanRecord) {
        let (accepted, full) = state.withLock { s -> (Bool, Bool) in
            guard !s.stopping, s.spans.count < capacity else { return (false, false) }
            s.spans.append(span)
            return (true, s.spans.count == batch)
        }
        if !accepted { dropped.increment() }
        if full { wake.signal() }
    }

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

    public func shutdown() {
        let first = state.withLock { s -> Bool in
            defer { s.stopping = true }
            return !s.stopping
        }
        guard first else { return }
        wake.signal()
        stopped.wait()
        close(fd)
    }

    private func writerLoop() {
        let timeoutNanos = interval.wholeNanoseconds
        // The batch taken and the room handed back are swapped, so neither regrows from empty.
        var batch: [SpanRecord] = []
        while true {
            _ = wake.wait(timeout: .now() + .nanoseconds(timeoutNanos))
            let (waiters, stopping) = state.withLock { s in
                swap(&s.spans, &batch)
                defer { s.flushWaiters = [] }
                return (s.flushWaiters, s.stopping)
            }
            if !batch.isEmpty { write(batch) }
            batch.removeAll(keepingCapacity: true)
            for w in waiters { w.signal() }
            if stopping {
                stopped.signal()
                return
            }
        }
    }

    private func write(_ spans: [SpanRecord]) {
        var out = [UInt8]()
        out.reserveCapacity(spans.count * 600)
        for span in spans { SpanJSON.append(span, resource: resourceJSON, to: &out) }
        // A write the file refuses (a full disk) loses the batch, counted; a line it cut short is
        // ended before the next batch, so every later line still parses.
        if !output.write(out) { dropped.increment(by: Int64(spans.count)) }
    }
}

/// A span as one line of OTLP/JSON-like text.
public enum SpanJSON {
    static func appendResource(serviceName: String, to out: inout [UInt8]) {
        out.append(contentsOf: #"{"attributes":[{"key":"service.name","value":{"stringValue":"#.utf8)
        appendString(serviceName, to: &out)
        out.append(contentsOf: "}}]}".utf8)
    }

    static func append(_ span: SpanRecord, resource: [UInt8], to out: inout [UInt8]) {
        out.append(contentsOf: #"{"traceId":""#.utf8)
        Hex.append(span.trace.traceIDHigh, to: &out)
        Hex.append(span.trace.traceIDLow, to: &out)
        out.append(contentsOf: #"","spanId":""#.utf8)
        Hex.append(span.trace.spanID, to: &out)
        out.append(UInt8(ascii: "\""))
        if let parent = span.parentSpanID {
            out.append(contentsOf: #","parentSpanId":""#.utf8)
            Hex.append(parent, to: &out)
            out.append(UInt8(ascii: "\""))
        }
        if span.trace.traceState != nil {
            out.append(contentsOf: #","traceState":"#.utf8)
            appendString(span.trace.traceState ?? "", to: &out)
        }
        out.append(contentsOf: #","name":"#.utf8)
        appendString(span.name, to: &out)
        out.append(contentsOf: #","kind":"#.utf8)
        appendDecimal(UInt64(kindNumber(span.kind)), to: &out)
        out.append(contentsOf: #","startTimeUnixNano":""#.utf8)
        appendDecimal(span.startNanoseconds, to: &out)
        out.append(contentsOf: #"","endTimeUnixNano":""#.utf8)
        appendDecimal(span.endNanoseconds, to: &out)
        out.append(contentsOf: #"","attributes":"#.utf8)
        appendAttributes(span.attributes, to: &out)
        if !span.events.isEmpty {
            out.append(contentsOf: #","events":["#.utf8)
            for (i, e) in span.events.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(contentsOf: #"{"timeUnixNano":""#.utf8)
                out.append(contentsOf: String(e.nanosecondsSinceEpoch).utf8)
                out.append(contentsOf: #"","name":"#.utf8)
                appendString(e.name, to: &out)
                out.append(contentsOf: #","attributes":"#.utf8)
                appendAttributes(e.attributes, to: &out)
                out.append(UInt8(ascii: "}"))
            }
            out.append(UInt8(ascii: "]"))
        }
        if !span.links.isEmpty {
            out.append(contentsOf: #","links":["#.utf8)
            for (i, l) in span.links.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(contentsOf: #"{"traceId":""#.utf8)
                Hex.append(l.traceIDHigh, to: &out)
                Hex.append(l.traceIDLow, to: &out)
                out.append(contentsOf: #"","spanId":""#.utf8)
                Hex.append(l.spanID, to: &out)
                out.append(contentsOf: #""}"#.utf8)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(contentsOf: #","status":{"code":"#.utf8)
        switch span.status?.code {
        case .ok: out.append(UInt8(ascii: "1"))
        case .error: out.append(UInt8(ascii: "2"))
        case nil: out.append(UInt8(ascii: "0"))
        }
        if let message = span.status?.message, !message.isEmpty {
            out.append(contentsOf: #","message":"#.utf8)
            appendString(message, to: &out)
        }
        out.append(contentsOf: #"},"resource":"#.utf8)
        out.append(contentsOf: resource)
        out.append(contentsOf: "}\n".utf8)
    }

    /// `value` in decimal, without making a String.
    static func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { b in
            var v = value
            var i = 20
            repeat {
                i -= 1
                b[i] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: v % 10)
                v /= 10
            } while v > 0
            out.append(contentsOf: UnsafeBufferPointer(rebasing: b[i..<20]))
        }
    }

    static func kindNumber(_ kind: SpanKind) -> Int {
        switch kind {
        case .internal: 1
        case .server: 2
        case .client: 3
        case .producer: 4
        case .consumer: 5
        }
    }

    static func appendAttributes(_ attributes: SpanAttributes, to out: inout [UInt8]) {
        var pairs: [(String, SpanAttribute)] = []
        attributes.forEach { pairs.append(($0, $1)) }
        pairs.sort { $0.0 < $1.0 }
        out.append(UInt8(ascii: "["))
        for (i, (key, value)) in pairs.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"key":"#.utf8)
            appendString(key, to: &out)
            out.append(contentsOf: #","value":"#.utf8)
            appendValue(value, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "]"))
    }

    static func appendValue(_ value: SpanAttribute, to out: inout [UInt8]) {
        func array(_ items: [SpanAttribute]) {
            out.append(contentsOf: #"{"arrayValue":{"values":["#.utf8)
            for (i, v) in items.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                appendValue(v, to: &out)
            }
            out.append(contentsOf: "]}}".utf8)
        }
        switch value {
        case .int32(let v):
            out.append(contentsOf: #"{"intValue":""#.utf8)
            out.append(contentsOf: String(v).utf8)
            out.append(contentsOf: #""}"#.utf8)
        case .int64(let v):
            out.append(contentsOf: #"{"intValue":""#.utf8)
            if v < 0 { out.append(UInt8(ascii: "-")) }
            appendDecimal(v.magnitude, to: &out)
            out.append(contentsOf: #""}"#.utf8)
        case .double(let v):
            out.append(contentsOf: #"{"doubleValue":"#.utf8)
            out.append(contentsOf: (v.isFinite ? String(v) : "0").utf8)
            out.append(UInt8(ascii: "}"))
        case .bool(let v): out.append(contentsOf: (v ? #"{"boolValue":true}"# : #"{"boolValue":false}"#).utf8)
        case .string(let s):
            out.append(contentsOf: #"{"stringValue":"#.utf8)
            appendString(s, to: &out)
            out.append(UInt8(ascii: "}"))
        case .int32Array(let a): array(a.map { .int32($0) })
        case .int64Array(let a): array(a.map { .int64($0) })
        case .doubleArray(let a): array(a.map { .double($0) })
        case .boolArray(let a): array(a.map { .bool($0) })
        case .stringArray(let a): array(a.map { .string($0) })
        case .stringConvertibleArray(let a): array(a.map { .string($0.description) })
        case .stringConvertible(let c):
            out.append(contentsOf: #"{"stringValue":"#.utf8)
            appendString(c.description, to: &out)
            out.append(UInt8(ascii: "}"))
        default:
            out.append(contentsOf: #"{"stringValue":""}"#.utf8)
        }
    }

    /// A JSON string: quotes, backslashes and every control character escaped (and DEL, U+2028,
    /// U+2029), so a line never breaks.
    static func appendString(_ string: String, to out: inout [UInt8]) { JSONString.append(string, to: &out) }
}

/// The metrics of span export, whichever the exporter.
public enum TracingMetrics {
    /// `tracing_spans_dropped_total`: spans not exported. From the process's registry (a counter
    /// made through swift-metrics' global factory would be bound to whatever backend exists when
    /// the exporter is made: at bootstrap, none yet).
    public static let spansDropped = ProcessMetrics.registry.makeCounter(
        descriptor: MetricNameDescriptor(
            metricName: "tracing_spans_dropped", unitName: "total",
            helpText: "Spans not exported: the buffer was full, the span file refused the write, "
                + "or the OTLP collector did not take them (after retries, or rejected)."))
}

/// A tracing setting that refuses the start.
public struct TracingSettingsError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
