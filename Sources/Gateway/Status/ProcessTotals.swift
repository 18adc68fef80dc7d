import GRPCContracts
import Observability

/// One scrape of a process, reduced to what the status page shows: its gRPC calls by status code
/// and their latency histogram (every method together, health checks left out), its gauges, and
/// its `outbox_*` series. Two of them, a few seconds apart, give the rates (`ProcessRates`).
struct ProcessTotals: Sendable, Equatable {
    /// Calls ended, by code name (`OK`, `NOT_FOUND`, ...): `grpc_server_handled_total` summed over
    /// methods.
    var calls: [String: Double] = [:]
    /// `grpc_server_handling_seconds`: `_sum`, `_count` and the cumulative buckets (upper bound →
    /// count), summed over methods.
    var latencySum: Double = 0
    var latencyCount: Double = 0
    var latencyBuckets: [Double: Double] = [:]
    var callsInFlight: Double?
    var connections: Double?
    /// Every `outbox_*` gauge (not a counter, not a histogram's part), by destination; nil when the
    /// process has none.
    var outbox: [OutboxRow]?

    /// Calls that are the load balancers' and the gateway's own probing, not traffic.
    static let ignoredServices: Set<String> = [Grpc_Health_V1_HealthMethods.serviceName]

    struct OutboxRow: Sendable, Equatable {
        var destination: String
        /// By metric name without `outbox_` (`backlog_events`, `parked_events`,
        /// `oldest_event_age_seconds`, ...).
        var values: [String: Double]
    }

    init() {}

    init(_ exposition: PrometheusExposition) {
        var outbox: [String: [String: Double]] = [:]
        var sawOutbox = false
        for s in exposition.samples {
            switch s.name {
            case "grpc_server_handled_total":
                guard let code = s["grpc_code"], !Self.ignoredServices.contains(s["grpc_service"] ?? "") else { continue }
                calls[code, default: 0] += s.value
            case "grpc_server_handling_seconds_sum":
                if !Self.ignoredServices.contains(s["grpc_service"] ?? "") { latencySum += s.value }
            case "grpc_server_handling_seconds_count":
                if !Self.ignoredServices.contains(s["grpc_service"] ?? "") { latencyCount += s.value }
            case "grpc_server_handling_seconds_bucket":
                guard !Self.ignoredServices.contains(s["grpc_service"] ?? ""), let le = s["le"].flatMap(Self.bound) else { continue }
                latencyBuckets[le, default: 0] += s.value
            case "grpc_server_calls_in_flight": callsInFlight = (callsInFlight ?? 0) + s.value
            case "grpc_server_connections": connections = (connections ?? 0) + s.value
            default:
                guard s.name.hasPrefix("outbox_"), Self.isGauge(s.name, exposition.types) else { continue }
                sawOutbox = true
                let metric = String(s.name.dropFirst("outbox_".count))
                let destination = s["destination"] ?? ""
                // Several databases with one destination (not in one process today): counts add up,
                // ages take the oldest.
                let combined = outbox[destination]?[metric].map { metric.contains("age") ? max($0, s.value) : $0 + s.value }
                outbox[destination, default: [:]][metric] = combined ?? s.value
            }
        }
        if sawOutbox {
            self.outbox = outbox.sorted { $0.key < $1.key }.map { OutboxRow(destination: $0.key, values: $0.value) }
        }
    }

    /// A gauge's sample: declared a gauge, or undeclared and not named like a counter or part of a
    /// histogram.
    static func isGauge(_ name: String, _ types: [String: String]) -> Bool {
        if let t = types[name] { return t == "gauge" || t == "untyped" }
        for suffix in ["_total", "_bucket", "_sum", "_count", "_created"] where name.hasSuffix(suffix) { return false }
        return true
    }

    static func bound(_ le: String) -> Double? { le == "+Inf" ? .infinity : Double(le) }

    var totalCalls: Double { calls.values.reduce(0, +) }
}

/// What a process did between two scrapes.
///
/// The error rule: **errors** are every call ended with a code other than `OK` and `CANCELLED`
/// (a cancelled call is the client's choice to stop waiting, not a failure of the service);
/// **server errors** are the codes that say the service failed rather than the request:
/// `UNKNOWN`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`, `DEADLINE_EXCEEDED`. The rest (the
/// codes Connect maps to 4xx, plus `UNIMPLEMENTED`, which here means a client asked for a method
/// the server does not route) are the clients' errors: shown, counted in the error rate, not in
/// the server error rate. Both rates are of every call ended, cancelled ones included.
struct ProcessRates: Sendable, Equatable {
    /// The window: seconds between the two scrapes.
    var seconds: Double
    var requestsPerSecond: Double
    var errorsPerSecond: Double
    var serverErrorsPerSecond: Double
    /// Codes other than OK that occurred, per second, the most frequent first.
    var codes: [CodeRate]
    /// Mean and estimated 95th percentile of call duration in the window (seconds); nil without calls.
    var meanLatency: Double?
    var p95Latency: Double?

    struct CodeRate: Sendable, Equatable {
        var code: String
        var perSecond: Double
    }

    static let serverErrorCodes: Set<String> = ["UNKNOWN", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "DEADLINE_EXCEEDED"]
    static let notErrors: Set<String> = ["OK", "CANCELLED"]

    /// Errors among all calls (0...1); nil without calls.
    var errorRatio: Double? { requestsPerSecond > 0 ? errorsPerSecond / requestsPerSecond : nil }
    var serverErrorRatio: Double? { requestsPerSecond > 0 ? serverErrorsPerSecond / requestsPerSecond : nil }

    /// The rates from `before` to `after`, `seconds` apart; nil for an empty window. A counter
    /// lower than before means the process restarted: it counts from zero (as Prometheus's
    /// `rate` does).
    init?(from before: ProcessTotals, to after: ProcessTotals, seconds: Double) {
        guard seconds > 0 else { return nil }
        func delta(_ a: Double?, _ b: Double) -> Double {
            let a = a ?? 0
            return b >= a ? b - a : b
        }
        let restarted = after.totalCalls < before.totalCalls || after.latencyCount < before.latencyCount
        let base = restarted ? ProcessTotals() : before
        self.seconds = seconds
        var total = 0.0
        var errors = 0.0
        var server = 0.0
        var codes: [CodeRate] = []
        for (code, value) in after.calls {
            let d = delta(base.calls[code], value)
            total += d
            if !Self.notErrors.contains(code) { errors += d }
            if Self.serverErrorCodes.contains(code) { server += d }
            if code != "OK", d > 0 { codes.append(CodeRate(code: code, perSecond: d / seconds)) }
        }
        requestsPerSecond = total / seconds
        errorsPerSecond = errors / seconds
        serverErrorsPerSecond = server / seconds
        self.codes = codes.sorted { ($0.perSecond, $1.code) > ($1.perSecond, $0.code) }
        let count = delta(base.latencyCount, after.latencyCount)
        meanLatency = count > 0 ? delta(base.latencySum, after.latencySum) / count : nil
        var buckets: [(le: Double, count: Double)] = []
        for (le, value) in after.latencyBuckets { buckets.append((le, delta(base.latencyBuckets[le], value))) }
        p95Latency = Self.quantile(0.95, buckets: buckets)
    }

    /// The `q` quantile of a cumulative histogram, as Prometheus's `histogram_quantile` estimates
    /// it: linear within the bucket it falls in; the highest finite bound when it falls in +Inf.
    static func quantile(_ q: Double, buckets: [(le: Double, count: Double)]) -> Double? {
        let sorted = buckets.sorted { $0.le < $1.le }
        guard let total = sorted.last?.count, total > 0, sorted.last?.le == .infinity else { return nil }
        let rank = q * total
        var lower = 0.0
        var below = 0.0
        for (le, count) in sorted {
            if count >= rank {
                if le == .infinity { return lower }
                let inBucket = count - below
                return inBucket > 0 ? lower + (le - lower) * (rank - below) / inBucket : le
            }
            lower = le
            below = count
        }
        return lower
    }
}
