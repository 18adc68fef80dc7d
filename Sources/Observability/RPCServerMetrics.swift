import Prometheus
import RPCCore
import Synchronization

/// Per-call server metrics in the registry of `ProcessMetrics`, in the names go-grpc-prometheus
/// made usual (so existing dashboards and alerts apply):
///
/// - `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}`: calls ended, by status;
/// - `grpc_server_handling_seconds{grpc_service,grpc_method}`: latency histogram, headers in to
///   status out;
/// - `grpc_server_msg_received_total` / `grpc_server_msg_sent_total` and
///   `grpc_server_received_bytes_total` / `grpc_server_sent_bytes_total` per method;
/// - `grpc_server_calls_in_flight`, `grpc_server_connections`: gauges per process.
///
/// Labels are bounded: methods the server routes (made at start), codes from the 17 statuses;
/// calls refused before routing count under `grpc_service="unknown", grpc_method="unknown"`.
///
/// Per call: two clock reads (in the transport), a few relaxed atomic adds, one histogram
/// record (a short lock, per method). Each server's in-flight and connection counts are kept
/// here and summed into the gauges when scraped.
public final class RPCServerMetrics: ServerCallObserver, Sendable {
    /// One method's metrics.
    final class Method: Sendable {
        let labels: [(String, String)]
        let ok: Counter
        let latency: ValueHistogram
        let received: Counter
        let sent: Counter
        let receivedBytes: Counter
        let sentBytes: Counter
        /// Non-OK codes, made when first seen (17 at most).
        private let errors = Mutex<[StatusCode: Counter]>([:])

        init(service: String, method: String) {
            let r = ProcessMetrics.registry
            labels = [("grpc_service", service), ("grpc_method", method)]
            ok = r.makeCounter(descriptor: Names.handled, labels: labels + [("grpc_code", StatusCode.ok.name)])
            latency = r.makeValueHistogram(descriptor: Names.handling, labels: labels, buckets: ProcessMetrics.latencyBucketSeconds)
            received = r.makeCounter(descriptor: Names.received, labels: labels)
            sent = r.makeCounter(descriptor: Names.sent, labels: labels)
            receivedBytes = r.makeCounter(descriptor: Names.receivedBytes, labels: labels)
            sentBytes = r.makeCounter(descriptor: Names.sentBytes, labels: labels)
        }

        func handled(_ code: StatusCode) -> Counter {
            if code == .ok { return ok }
            return errors.withLock { e in
                if let c = e[code] { return c }
                let c = ProcessMetrics.registry.makeCounter(descriptor: Names.handled, labels: labels + [("grpc_code", code.name)])
                e[code] = c
                return c
            }
        }
    }

    /// The metric names (one help text each: swift-prometheus stops a process that registers a
    /// name twice with different help).
    enum Names {
        static func d(_ name: String, _ unit: String, _ help: String) -> MetricNameDescriptor {
            .init(metricName: name, unitName: unit, helpText: help)
        }
        static var handled: MetricNameDescriptor { d("grpc_server_handled", "total", "gRPC calls completed on the server, by status code.") }
        static var handling: MetricNameDescriptor {
            d("grpc_server_handling", "seconds", "Time from a call's request headers to its status, by method.")
        }
        static var received: MetricNameDescriptor { d("grpc_server_msg_received", "total", "Request messages received.") }
        static var sent: MetricNameDescriptor { d("grpc_server_msg_sent", "total", "Response messages sent.") }
        static var receivedBytes: MetricNameDescriptor {
            d("grpc_server_received_bytes", "total", "Request message bytes received (as sent: compressed when compressed).")
        }
        static var sentBytes: MetricNameDescriptor {
            d("grpc_server_sent_bytes", "total", "Response message bytes handed to the transport (before compression).")
        }
    }

    /// The methods prepared at start, found by descriptor identity without a lock.
    final class Table: Sendable {
        let methods: [ObjectIdentifier: Method]
        init(_ methods: [ObjectIdentifier: Method]) { self.methods = methods }
    }
    private let table = AtomicLazyReference<Table>()
    /// Methods not prepared (a server without `prepare`, tests), made when first seen.
    private let late = Mutex<[ObjectIdentifier: Method]>([:])
    private let unknown: Method
    private let inFlight = Atomic<Int>(0)
    private let connections = Atomic<Int>(0)

    public init() {
        ProcessMetrics.bootstrap()
        unknown = Method(service: "unknown", method: "unknown")
        ProcessMetrics.collectOnScrape(self)
    }

    public func prepare(_ methods: [MethodDescriptor]) {
        var m: [ObjectIdentifier: Method] = [:]
        for d in methods { m[ObjectIdentifier(d)] = Method(service: d.service, method: d.method) }
        // Set once (a server prepares once); methods of a later call are made as first seen.
        _ = table.storeIfNil(Table(m))
    }

    private func metrics(for method: MethodDescriptor?) -> Method {
        guard let method else { return unknown }
        let key = ObjectIdentifier(method)
        if let m = table.load()?.methods[key] { return m }
        return late.withLock { late in
            if let m = late[key] { return m }
            let m = Method(service: method.service, method: method.method)
            late[key] = m
            return m
        }
    }

    public func callStarted() { inFlight.add(1, ordering: .relaxed) }

    public func callEnded(_ call: ServerCallRecord) {
        inFlight.subtract(1, ordering: .relaxed)
        let m = metrics(for: call.method)
        m.handled(call.code).increment()
        m.latency.record(call.duration.inSeconds)
        if call.requestMessages > 0 {
            m.received.increment(by: Int64(call.requestMessages))
            m.receivedBytes.increment(by: Int64(call.requestBytes))
        }
        if call.responseMessages > 0 {
            m.sent.increment(by: Int64(call.responseMessages))
            m.sentBytes.increment(by: Int64(call.responseBytes))
        }
    }

    public func connection(opened: Bool) { connections.add(opened ? 1 : -1, ordering: .relaxed) }

    /// Calls in flight and connections open on the servers this observes.
    public var callsInFlight: Int { inFlight.load(ordering: .relaxed) }
    public var openConnections: Int { connections.load(ordering: .relaxed) }
}

extension RPCServerMetrics: ScrapeCollector {
    public func contribute(to totals: inout [String: Double]) {
        totals["grpc_server_calls_in_flight", default: 0] += Double(callsInFlight)
        totals["grpc_server_connections", default: 0] += Double(openConnections)
    }
}
