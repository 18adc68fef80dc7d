import Foundation
import Logging
import Synchronization
import Tracing

/// What a process's settings ask of tracing: `TRACE_EXPORT` (`--trace-export`) and
/// `TRACE_SAMPLE_RATIO` (`--trace-sample-ratio`). Off by default.
public struct TracingSettings: Sendable, Hashable {
    public enum Export: Sendable, Hashable {
        /// No tracer: nothing is traced and no call does anything for it.
        case off
        /// Spans as JSON lines appended to this file (`SpanFileExporter`).
        case file(String)
    }

    public var export: Export
    /// The share of new traces recorded (0…1); a call that arrives with a `traceparent` follows
    /// its sampled flag instead.
    public var sampleRatio: Double

    /// The ratio when tracing is on and none is set: 1 %, cheap enough to leave on.
    public static let defaultSampleRatio = 0.01

    public init(export: Export = .off, sampleRatio: Double = TracingSettings.defaultSampleRatio) {
        self.export = export
        self.sampleRatio = sampleRatio
    }

    public static let off = TracingSettings()

    /// Reads the settings' text: `export` is `off` (or unset) or `file:<path>`; `ratio` a number
    /// in 0…1. Throws a message naming the setting.
    public static func parse(export: String?, ratio: String?) throws -> TracingSettings {
        var s = TracingSettings()
        switch export?.trimmingCharacters(in: .whitespaces) {
        case nil, "", "off", "none": s.export = .off
        case let e? where e.hasPrefix("file:") && e.count > 5: s.export = .file(String(e.dropFirst(5)))
        case let e?:
            throw TracingSettingsError(
                "TRACE_EXPORT must be off or file:<path> (OTLP goes through a collector reading the file), got '\(e)'")
        }
        if let text = ratio?.trimmingCharacters(in: .whitespaces), !text.isEmpty {
            guard let r = Double(text), r.isFinite, (0...1).contains(r) else {
                throw TracingSettingsError("TRACE_SAMPLE_RATIO must be a number from 0 to 1, got '\(text)'")
            }
            s.sampleRatio = r
        }
        return s
    }
}

/// The process's tracer, made once at start from its settings (`bootstrap`), or none when tracing
/// is off. What starts the process's server, peer clients, outbox delivery and gateway relay
/// reads it once, when it builds them; no call reads it.
public enum ProcessTracing {
    private static let state = Mutex<(done: Bool, tracer: SpanTracer?)>((false, nil))

    /// The tracer, nil when tracing is off (or not bootstrapped: tests that run in-process).
    public static var tracer: SpanTracer? { state.withLock { $0.tracer } }

    /// Makes the process's tracer from `settings` (once per process: later calls return the
    /// first's), and bootstraps swift-distributed-tracing's `InstrumentationSystem` with it so
    /// that libraries using the `Tracing` API join the same traces. Off: nil, and the
    /// instrumentation system keeps its no-op tracer.
    ///
    /// `notesCalls`: whether the process writes an access log, whose lines take the call's span.
    @discardableResult
    public static func bootstrap(_ settings: TracingSettings, serviceName: String, notesCalls: Bool = true) throws -> SpanTracer? {
        try state.withLock { s -> SpanTracer? in
            if s.done { return s.tracer }
            s.done = true
            guard case .file(let path) = settings.export else { return nil }
            let tracer = SpanTracer(
                serviceName: serviceName, sampler: RatioSampler(ratio: settings.sampleRatio),
                exporter: try SpanFileExporter(path: path, serviceName: serviceName), notesCalls: notesCalls)
            InstrumentationSystem.bootstrap(tracer)
            s.tracer = tracer
            return tracer
        }
    }

    /// Writes out the spans still buffered and closes the exporter (at the end of the process).
    public static func shutdown() { tracer?.shutdown() }

    /// The `trace_id` and `span_id` of the task's current span, for every log line written inside
    /// a traced call (`LOG_FORMAT=json` lifts them next to `msg`).
    public static let metadataProvider = Logger.MetadataProvider {
        guard let c = TraceContext.current else { return [:] }
        return ["trace_id": .string(c.traceIDHex), "span_id": .string(c.spanIDHex)]
    }
}
