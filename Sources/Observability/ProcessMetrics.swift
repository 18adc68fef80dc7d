import CoreMetrics
import Prometheus

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

    /// The Prometheus text exposition of everything recorded so far: the registry's families,
    /// then the RPC call families (`RPCCallTotals`, counted per event loop and summed here).
    public static func exposition() -> String {
        bootstrap()
        return registry.emitToString() + RPCCallTotals.exposition()
    }

    /// The exposition's bytes (for the HTTP handler).
    public static func expositionBytes() -> [UInt8] {
        bootstrap()
        var bytes = registry.emitToBuffer()
        bytes += RPCCallTotals.exposition().utf8
        return bytes
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
