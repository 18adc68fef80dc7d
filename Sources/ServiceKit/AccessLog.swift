import GRPCContracts
import Logging
import Observability
import RPCCore

/// One access-log line per finished call, for the transport's call-end hook to write: at `info`
/// through a logger labelled `access`, the message `accounts.v1.Accounts/GetProfile OK 1.234ms`
/// and the metadata
///
/// | key | value |
/// |---|---|
/// | `rpc.method` | `accounts.v1.Accounts/GetProfile` (the path without its leading `/`) |
/// | `rpc.code` | the status name: `OK`, `NOT_FOUND`, … |
/// | `duration_ms` | milliseconds with 3 decimals (`1.234`) |
/// | `peer` | the client's address |
/// | `user` | the caller's user id; absent when the call was not authenticated |
/// | `trace_id`, `span_id` | the call's server span, when the process traces (`TRACE_EXPORT`) |
///
/// What a line may hold is fixed by the signature: a method, a status code, a duration, an
/// address and a verified identity, of which only the user id is written (never its session).
/// Nothing takes a token, a password, metadata or a message, so none can reach the log.
///
/// `ACCESS_LOG=off` (`ServiceSettings.accessLog`) turns the lines off: `AccessLog(settings:)` is
/// nil then. They are `info` lines, so `LOG_LEVEL=warning` hides them too.
public struct AccessLog: Sendable {
    /// The label of the access log's logger.
    public static let label = "access"
    /// Calls to it are logged only when they fail (`AccessLogObserver`).
    public static let healthService = Grpc_Health_V1_HealthMethods.serviceName
    /// The longest method or peer text written; longer (a path a client made up) is cut, ending `…`.
    public static let maxFieldLength = 256

    public var logger: Logger

    public init(logger: Logger = Logger(label: AccessLog.label)) {
        self.logger = logger
    }

    /// The process's access log, or nil when `ACCESS_LOG=off`.
    public init?(settings: ServiceSettings, logger: Logger = Logger(label: AccessLog.label)) {
        guard settings.accessLog else { return nil }
        self.init(logger: logger)
    }

    /// Logs the line of one finished call. `method` is the call's path (`/pkg.Service/Method`, as
    /// on the wire) or `pkg.Service/Method`.
    public func line(method: String, code: StatusCode, duration: Duration, peer: String, user: CallerIdentity?, trace: TraceContext? = nil) {
        let entry = Self.entry(method: method, code: code, duration: duration, peer: peer, user: user, trace: trace)
        logger.info("\(entry.message)", metadata: entry.metadata)
    }

    public func line(method: MethodDescriptor, code: StatusCode, duration: Duration, peer: String, user: CallerIdentity?) {
        line(method: method.path, code: code, duration: duration, peer: peer, user: user)
    }

    /// What `line` logs: the message and the metadata.
    public struct Entry: Sendable {
        public var message: String
        public var metadata: Logger.Metadata
    }

    public static func entry(
        method: String, code: StatusCode, duration: Duration, peer: String, user: CallerIdentity?, trace: TraceContext? = nil
    ) -> Entry {
        let method = bounded(method.hasPrefix("/") ? String(method.dropFirst()) : method)
        let ms = milliseconds(duration)
        var metadata: Logger.Metadata = [
            "rpc.method": .string(method), "rpc.code": .string(code.name), "duration_ms": .string(ms), "peer": .string(bounded(peer)),
        ]
        if let user { metadata["user"] = .string(user.userID) }
        if let trace {
            metadata["trace_id"] = .string(trace.traceIDHex)
            metadata["span_id"] = .string(trace.spanIDHex)
        }
        return Entry(message: "\(method) \(code.name) \(ms)ms", metadata: metadata)
    }

    /// `duration` in milliseconds with 3 decimals, rounded to the microsecond (`1.234`, `0.000`,
    /// `12000.500`); a negative duration is `0.000`.
    public static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0, attoseconds >= 0 else { return "0.000" }
        // attoseconds per microsecond: 10^12; rounded half up.
        let micro = min(seconds, 1 << 40) * 1_000_000 + (attoseconds + 500_000_000_000) / 1_000_000_000_000
        let fraction = String(micro % 1000)
        return "\(micro / 1000).\(String(repeating: "0", count: 3 - fraction.count))\(fraction)"
    }

    static func bounded(_ text: String) -> String {
        text.utf8.count <= maxFieldLength || text.count <= maxFieldLength ? text : String(text.prefix(maxFieldLength - 1)) + "…"
    }
}

/// The access log as the transport's call observer: one line per call the server ends, whatever
/// ended it (docs/observability.md). None when the logger's level hides info lines (the level is
/// set once, at start): then the transport is not even told.
public final class AccessLogObserver: ServerCallObserver {
    public let log: AccessLog
    /// Whether calls have server spans whose ids the lines carry (the process traces); read once.
    let traced: Bool
    public init?(_ log: AccessLog, traced: Bool = ProcessTracing.tracer != nil) {
        guard log.logger.logLevel <= .info else { return nil }
        self.log = log
        self.traced = traced
    }

    public func callEnded(_ call: ServerCallRecord) {
        // Health checks that answer are the probes' and the gateway's polls, every few seconds
        // from each: counted in the metrics, not logged (a failing one is).
        if call.code == .ok, call.method?.service == AccessLog.healthService { return }
        log.line(
            method: call.method?.path ?? "unknown", code: call.code, duration: call.duration, peer: call.peer,
            user: call.context?.identity, trace: traced ? RPCTracing.traceContext(of: call.context) : nil)
    }
}
