import CoreMetrics
import Prometheus
import Synchronization

/// The process's metrics: one Prometheus registry, behind the swift-metrics facade too, so that
/// code anywhere (storage, outbox, limits) records with `CoreMetrics` (`Counter`, `Gauge`,
/// `Timer`, `Recorder`) and every process's `GET /metrics` shows it in the Prometheus text format.
///
/// swift-metrics is bootstrapped once per process (`MetricsSystem.bootstrap` may not run twice),
/// so every server in a process (tests run several in one) shares the registry: tests compare
/// values before and after what they did, or read a metric with labels only they use.
///
/// Label sets are bounded: method paths only of routed methods, status code names, destinations
/// and queue names from the code; never a user id, an address or a raw path.
public enum ProcessMetrics {
    /// The registry every metric of the process is in.
    public static let registry: PrometheusCollectorRegistry = {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = latencyBuckets
        MetricsSystem.bootstrap(factory)
        return registry
    }()

    /// Latency buckets (seconds in the exposition): 100 µs to 10 s.
    public static let latencyBuckets: [Duration] = [
        .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2.5),
        .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100),
        .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(10),
    ]
    /// The same in seconds, for histograms of `Double` seconds: recording one compares doubles,
    /// where a `Duration` histogram's generic comparisons cost about a tenth of a relayed call.
    public static let latencyBucketSeconds: [Double] = latencyBuckets.map(\.inSeconds)

    /// Makes sure the facade is bootstrapped (idempotent; call it at process start, before any
    /// `CoreMetrics` metric is made, or those go to the no-op backend).
    public static func bootstrap() { _ = registry }

    /// The Prometheus text exposition of everything recorded so far.
    public static func exposition() -> String {
        collect()
        return registry.emitToString()
    }

    /// The exposition's bytes (for the HTTP handler).
    public static func expositionBytes() -> [UInt8] {
        collect()
        return registry.emitToBuffer()
    }

    // MARK: Values summed when scraped

    private final class Weak: Sendable {
        nonisolated(unsafe) weak var collector: (any ScrapeCollector)?
        init(_ c: any ScrapeCollector) { collector = c }
    }
    private static let collectors = Mutex<[Weak]>([])
    /// Gauges set from the collectors at each scrape, by name.
    private static let collectedGauges = Mutex<[String: Prometheus.Gauge]>([:])

    /// Registers a source of gauge values read at each scrape (kept weakly: a server that is
    /// gone stops contributing). For counts kept per server and loop without shared writes.
    public static func collectOnScrape(_ collector: any ScrapeCollector) {
        bootstrap()
        collectors.withLock { list in
            list.removeAll { $0.collector == nil }
            list.append(Weak(collector))
        }
    }

    /// Sums every live collector's contributions into their gauges.
    static func collect() {
        bootstrap()
        let live = collectors.withLock { list in list.compactMap(\.collector) }
        var totals: [String: Double] = [:]
        for c in live { c.contribute(to: &totals) }
        collectedGauges.withLock { gauges in
            for (name, value) in totals {
                let gauge =
                    gauges[name]
                    ?? {
                        let g = registry.makeGauge(
                            descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: ScrapeHelp.text(name)))
                        gauges[name] = g
                        return g
                    }()
                gauge.set(to: value)
            }
        }
    }

    /// The content type of `exposition()`.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    /// The value of one sample in an exposition (tests and the status page): the line
    /// `name{labels} value`, labels as written (in their order of creation); nil when absent.
    public static func sample(_ name: String, labels: [(String, String)] = [], in text: String) -> Double? {
        let prefix =
            labels.isEmpty
            ? "\(name) " : "\(name){\(labels.map { "\($0.0)=\"\($0.1)\"" }.joined(separator: ","))} "
        for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
            return Double(line.dropFirst(prefix.count).split(separator: " ").first ?? "")
        }
        return nil
    }
}

/// Something that contributes gauge values at scrape time (`ProcessMetrics.collectOnScrape`).
public protocol ScrapeCollector: AnyObject, Sendable {
    /// Adds this collector's values to `totals`, by metric name (several collectors may add to
    /// the same name: they are summed).
    func contribute(to totals: inout [String: Double])
}

/// Help texts of the gauges collected at scrape time.
enum ScrapeHelp {
    static let texts: [String: String] = [
        "grpc_server_calls_in_flight": "gRPC calls started and not yet ended.",
        "grpc_server_connections": "Open client connections (any protocol).",
    ]
    static func text(_ name: String) -> String { texts[name] ?? name }
}
