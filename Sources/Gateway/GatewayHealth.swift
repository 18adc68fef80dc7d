import GRPCContracts
import Logging
import Observability
import Prometheus
import RPCCore
import RPCServices
import Synchronization

/// The gateway's own `grpc.health.v1.Health`: each public service is SERVING while its upstream
/// answers its health check, and the server as a whole ("") is SERVING while every required
/// upstream (`GATEWAY_UPSTREAMS`) is. Upstreams are polled every few seconds, and again on a
/// Check when the last poll is older than `maxAge`, so a readiness probe sees changes at once.
/// `processService` ("gateway") is SERVING from the start until shutdown begins, whatever the
/// upstreams do: what readiness and liveness probes ask, so one service down does not take every
/// gateway replica out of its Service (that service's methods answer UNAVAILABLE fast instead).
public final class GatewayHealth: Grpc_Health_V1_HealthService, Sendable {
    /// The health name of the gateway process itself: SERVING while it runs and is not draining,
    /// independent of the upstreams (probes ask for it; "" aggregates the required upstreams).
    public static let processService = "gateway"

    struct Upstream: Sendable {
        let name: String
        let transport: any ClientTransport
        let services: [String]
    }

    let table: HealthService
    let upstreams: [Upstream]
    let required: Set<String>
    let timeout: Duration
    let maxAge: Duration
    let logger: Logger
    /// `gateway_upstream_up{upstream}`: 1 while the upstream answered its last health check
    /// SERVING, else 0 (0 until the first poll).
    let upGauges: [String: Gauge]

    private struct State {
        var lastPoll: ContinuousClock.Instant?
        var inFlight: Task<Void, Never>?
        var upstreamStatus: [String: Bool] = [:]
        /// Why each upstream failed its last check (the transport's words, its address included):
        /// the gateway's operators get them here and in its log; clients are told only that the
        /// upstream is unavailable (`PooledChannel.worded`).
        var upstreamFailure: [String: String] = [:]
        var stopped = false
    }
    private let state = Mutex(State())

    init(
        upstreams: [Upstream], required: Set<String>, timeout: Duration = .seconds(1), maxAge: Duration = .milliseconds(500),
        logger: Logger
    ) {
        self.upstreams = upstreams
        self.required = required
        self.timeout = timeout
        self.maxAge = maxAge
        self.logger = logger
        upGauges = Dictionary(
            upstreams.map { u in
                let gauge = ProcessMetrics.registry.makeGauge(
                    descriptor: MetricNameDescriptor(
                        metricName: "gateway_upstream_up", unitName: "",
                        helpText: "1 when the upstream answered the gateway's last health check SERVING, else 0."),
                    labels: [("upstream", u.name)])
                gauge.set(to: 0)
                return (u.name, gauge)
            }, uniquingKeysWith: { a, _ in a })
        table = HealthService(services: upstreams.flatMap(\.services) + [Self.processService])
        // Nothing is known to be up until the first poll; the process itself is.
        table.markAllNotServing()
        table.setStatus(.serving, for: Self.processService)
    }

    /// Whether an upstream answered its last health check (for tests and the status page).
    public func isServing(upstream: String) -> Bool { state.withLock { $0.upstreamStatus[upstream] ?? false } }
    /// Why an upstream failed its last health check; nil while it answers.
    public func failure(upstream: String) -> String? { state.withLock { $0.upstreamFailure[upstream] } }
    public var overall: Grpc_Health_V1_HealthCheckResponse.ServingStatus { table.status(of: "") ?? .notServing }

    /// Polls every upstream once (concurrent polls share one round).
    public func poll() async {
        let task: Task<Void, Never> = state.withLock { s in
            if let t = s.inFlight { return t }
            let t = Task { await self.pollRound() }
            s.inFlight = t
            return t
        }
        await task.value
    }

    private func pollRound() async {
        let (results, failures) = await withTaskGroup(of: (String, String?).self) { group in
            for u in upstreams {
                group.addTask { (u.name, await self.check(u)) }
            }
            var r: [String: Bool] = [:]
            var f: [String: String] = [:]
            for await (name, failure) in group {
                r[name] = failure == nil
                f[name] = failure
            }
            return (r, f)
        }
        if state.withLock({ $0.stopped }) {
            state.withLock { $0.inFlight = nil }
            return
        }
        var allRequired = true
        for u in upstreams {
            let ok = results[u.name] ?? false
            upGauges[u.name]?.set(to: ok ? 1 : 0)
            for s in u.services { table.setStatus(ok ? .serving : .notServing, for: s) }
            if required.contains(u.name) && !ok { allRequired = false }
        }
        table.setStatus(allRequired ? .serving : .notServing, for: "")
        let changed: [(String, Bool)] = state.withLock { s in
            let changed = results.filter { s.upstreamStatus[$0.key] != $0.value }.map { ($0.key, $0.value) }
            s.upstreamStatus = results
            s.upstreamFailure = failures
            s.lastPoll = .now
            s.inFlight = nil
            return changed
        }
        for (name, ok) in changed.sorted(by: { $0.0 < $1.0 }) {
            if ok {
                logger.info("upstream \(name) is serving")
            } else {
                logger.warning("upstream \(name) is not serving: \(failures[name] ?? "no answer")")
            }
        }
    }

    /// Nil when the upstream answers SERVING, else why not.
    private func check(_ u: Upstream) async -> String? {
        let client = Grpc_Health_V1_HealthClient(RPCClient(transport: u.transport))
        do {
            let r = try await client.check(Grpc_Health_V1_HealthCheckRequest(), options: CallOptions(timeout: timeout))
            return r.status == .serving ? nil : "its health check answered \(r.status)"
        } catch {
            // No answer (or no connection): if the upstream vanished without closing, the relayed
            // calls on its open connections would hang until their deadlines; a PING each tells.
            (u.transport as? UpstreamPool)?.checkConnections(timeout: timeout)
            return (error as? RPCError)?.message ?? "\(error)"
        }
    }

    /// Polls every `interval` until cancelled.
    func run(interval: Duration) async {
        while !Task.isCancelled {
            await poll()
            try? await Task.sleep(for: interval)
        }
    }

    /// Shutdown (SIGTERM, draining): NOT_SERVING everywhere, the process's own name included, from
    /// now on (load balancers and readiness probes stop sending).
    public func markAllNotServing() {
        state.withLock { $0.stopped = true }
        table.markAllNotServing()
    }

    /// Polls the upstreams when the last round is older than `maxAge` (and not after shutdown):
    /// what every health question asks first, so a busy load balancer does not multiply polls.
    public func refreshIfStale() async {
        let stale = state.withLock { s in !s.stopped && (s.lastPoll.map { ContinuousClock.now - $0 > maxAge } ?? true) }
        if stale { await poll() }
    }

    public func check(request: Grpc_Health_V1_HealthCheckRequest, context: ServerContext) async throws -> Grpc_Health_V1_HealthCheckResponse {
        // The process's own name answers at once: a probe's answer never waits on an upstream.
        if request.service != Self.processService { await refreshIfStale() }
        return try await table.check(request: request, context: context)
    }

    public func watch(
        request: Grpc_Health_V1_HealthCheckRequest, responses: ResponseWriter<Grpc_Health_V1_HealthCheckResponse>,
        context: ServerContext
    ) async throws {
        try await table.watch(request: request, responses: responses, context: context)
    }
}
