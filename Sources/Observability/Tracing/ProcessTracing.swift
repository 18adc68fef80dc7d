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
        /// Spans sent to an OTLP/gRPC collector (`OTLPExporter`, in the OTLPExport module: the
        /// process's bootstrap makes it, `ProcessTracing.bootstrap(_:serviceName:notesCalls:otlp:)`).
        case otlp(OTLPEndpoint)
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

    /// Reads the settings' text: `export` is `off` (or unset), `file:<path>`, `otlp://host:port`
    /// (OTLP/gRPC over h2c) or `otlps://host:port` (over TLS); `ratio` a number in 0…1. Throws a
    /// message naming the setting.
    public static func parse(export: String?, ratio: String?) throws -> TracingSettings {
        var s = TracingSettings()
        switch export?.trimmingCharacters(in: .whitespaces) {
        case nil, "", "off", "none": s.export = .off
        case let e? where e.hasPrefix("file:") && e.count > 5: s.export = .file(String(e.dropFirst(5)))
        case let e? where e.hasPrefix("otlp://") || e.hasPrefix("otlps://"):
            guard let endpoint = OTLPEndpoint(e) else {
                throw TracingSettingsError("TRACE_EXPORT must name the collector as otlp://host:port or otlps://host:port, got '\(e)'")
            }
            s.export = .otlp(endpoint)
        case let e?:
            throw TracingSettingsError(
                "TRACE_EXPORT must be off, file:<path>, otlp://host:port (OTLP/gRPC, h2c) or otlps://host:port (TLS), got '\(e)'")
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

/// Where an OTLP/gRPC collector listens: `otlp://host:port` (h2c) or `otlps://host:port` (TLS).
/// The port may be left out: 4317, OTLP/gRPC's.
public struct OTLPEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var tls: Bool

    public init(host: String, port: Int, tls: Bool) {
        self.host = host
        self.port = port
        self.tls = tls
    }

    /// `otlp://host[:port]` or `otlps://host[:port]` (`[v6]` hosts too), with nothing after the
    /// port but an optional `/`; nil otherwise.
    public init?(_ text: String) {
        let rest: Substring
        if text.hasPrefix("otlp://") {
            tls = false
            rest = text.dropFirst(7)
        } else if text.hasPrefix("otlps://") {
            tls = true
            rest = text.dropFirst(8)
        } else {
            return nil
        }
        let authority = rest.hasSuffix("/") ? rest.dropLast() : rest
        guard !authority.isEmpty, !authority.contains("/"), !authority.contains("@"), !authority.contains(where: \.isWhitespace)
        else { return nil }
        var host = Substring(authority)
        var port = 4317
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let p = Int(after.dropFirst()) else { return nil }
                port = p
            }
        } else if let colon = authority.lastIndex(of: ":") {
            host = authority[..<colon]
            guard let p = Int(authority[authority.index(after: colon)...]) else { return nil }
            port = p
        }
        guard !host.isEmpty, !host.contains(":") || authority.hasPrefix("["), (1...65535).contains(port) else { return nil }
        self.host = String(host)
        self.port = port
    }

    public var description: String {
        "\(tls ? "otlps" : "otlp")://\(host.contains(":") ? "[\(host)]" : host):\(port)"
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
    /// `otlp` makes the exporter for `TRACE_EXPORT=otlp://…` (this module has no RPC client:
    /// `ServiceHost` passes one that makes an `OTLPExporter`); without it such a setting throws.
    @discardableResult
    public static func bootstrap(
        _ settings: TracingSettings, serviceName: String, notesCalls: Bool = true,
        otlp: ((OTLPEndpoint) throws -> any SpanExporter)? = nil
    ) throws -> SpanTracer? {
        try state.withLock { s -> SpanTracer? in
            if s.done { return s.tracer }
            s.done = true
            let exporter: any SpanExporter
            switch settings.export {
            case .off: return nil
            case .file(let path): exporter = try SpanFileExporter(path: path, serviceName: serviceName)
            case .otlp(let endpoint):
                guard let otlp else { throw TracingSettingsError("TRACE_EXPORT=\(endpoint): this process has no OTLP exporter") }
                exporter = try otlp(endpoint)
            }
            let tracer = SpanTracer(
                serviceName: serviceName, sampler: RatioSampler(ratio: settings.sampleRatio), exporter: exporter, notesCalls: notesCalls)
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
