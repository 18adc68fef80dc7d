import Foundation
import Logging
import Observability
import Synchronization

/// What the status page shows (`GET /status`, `/status.json`; docs/observability.md, "Status
/// page"): every process's health and what its own metrics say. In the background the board
/// scrapes each upstream's `GET /metrics` (and reads the gateway's own registry in place) every
/// `interval`, all targets at once, each within `timeout`; it keeps per process the last good
/// scrape, the rates between the last two, and how the last attempt went. The page only reads
/// that state: a slow or down upstream never holds it up.
public final class StatusBoard: Sendable {
    public struct Target: Sendable {
        public enum Source: Sendable {
            /// `GET /metrics` from a process of the cluster.
            case http(host: String, port: Int)
            /// This process's own exposition, read in place; nil when its metrics are off.
            case local(@Sendable () -> [UInt8]?)
        }

        public var name: String
        public var source: Source
        /// Whether the gateway's own health (`""`, /healthz) requires this upstream.
        public var required: Bool

        public init(name: String, source: Source, required: Bool = true) {
            self.name = name
            self.source = source
            self.required = required
        }
    }

    /// Fetches the exposition of an `.http` target (tests replace it).
    public typealias Fetch = @Sendable (_ host: String, _ port: Int, _ timeout: Duration) async throws -> [UInt8]

    let targets: [Target]
    /// How often to scrape; nil: never (the page shows health only).
    let interval: Duration?
    let timeout: Duration
    let fetch: Fetch
    /// Whether a target is serving (the gateway's health polls; for the gateway itself its
    /// overall health).
    let serving: @Sendable (String) -> Bool
    /// Where a target that starts failing is told (once per outage), with the address and full reason.
    let logger: Logger

    struct Scrape: Sendable {
        var at: ContinuousClock.Instant
        var wall: Date
        var totals: ProcessTotals
    }

    struct TargetState: Sendable {
        var last: Scrape?
        var rates: ProcessRates?
        var attempted = false
        /// Why the last attempt failed; nil when it succeeded.
        var failure: String?
        var metricsOff = false
    }
    private let state = Mutex<[String: TargetState]>([:])

    public init(
        targets: [Target], interval: Duration?, timeout: Duration, serving: @escaping @Sendable (String) -> Bool,
        logger: Logger = Logger(label: "gateway.status"), fetch: @escaping Fetch
    ) {
        self.logger = logger
        self.targets = targets
        self.interval = interval
        self.timeout = timeout
        self.serving = serving
        self.fetch = fetch
    }

    /// The timeout for an interval: half of it, between 200 ms and 2 s.
    public static func timeout(for interval: Duration) -> Duration {
        max(.milliseconds(200), min(.seconds(2), interval / 2))
    }

    /// Scrapes every `interval` until cancelled (returns at once when scraping is off).
    func run() async {
        guard let interval else { return }
        while !Task.isCancelled {
            let next = ContinuousClock.now + interval
            await scrapeOnce()
            try? await Task.sleep(until: next, clock: .continuous)
        }
    }

    /// One round: every target at once; returns when all have answered or timed out.
    public func scrapeOnce() async {
        await withTaskGroup(of: Void.self) { group in
            for t in targets { group.addTask { await self.scrape(t) } }
        }
    }

    private func scrape(_ target: Target) async {
        let result: Result<[UInt8]?, any Error>
        switch target.source {
        case .local(let read): result = .success(read())
        case .http(let host, let port):
            do { result = .success(try await fetch(host, port, timeout)) } catch { result = .failure(error) }
        }
        let now = ContinuousClock.now
        let wall = Date()
        switch result {
        case .success(nil):
            state.withLock { $0[target.name] = TargetState(attempted: true, metricsOff: true) }
        case .success(let bytes?):
            let totals = ProcessTotals(PrometheusExposition(parsing: bytes))
            state.withLock { all in
                var s = all[target.name] ?? TargetState()
                let previous = s.last
                s.last = Scrape(at: now, wall: wall, totals: totals)
                s.rates = previous.flatMap { p in
                    ProcessRates(from: p.totals, to: totals, seconds: (now - p.at) / .seconds(1))
                }
                s.attempted = true
                s.failure = nil
                s.metricsOff = false
                all[target.name] = s
            }
        case .failure(let error):
            let why = (error as? MetricsFetch.Failure)?.description ?? "failed"
            let wasFailing = state.withLock { all in
                var s = all[target.name] ?? TargetState()
                let was = s.failure != nil
                s.attempted = true
                s.failure = why
                // A rate across an outage would blend the time before and after it: start again.
                s.rates = nil
                all[target.name] = s
                return was
            }
            // The page shows a short public reason; the operator's log gets where and why, once
            // per outage.
            if !wasFailing, case .http(let host, let port) = target.source {
                let detail = (error as? MetricsFetch.Failure)?.detail ?? "\(error)"
                logger.warning("status page: cannot scrape \(target.name) at \(host):\(port)/metrics: \(detail)")
            }
        }
    }

    /// What the page shows now.
    public func report(now: Date = Date()) -> StatusReport {
        let states = state.withLock { $0 }
        var processes: [ProcessStatus] = []
        for t in targets {
            let s = states[t.name] ?? TargetState()
            var p = ProcessStatus(name: t.name, isGateway: { if case .local = t.source { true } else { false } }(), required: t.required)
            p.serving = serving(t.name)
            p.lastScrape = s.last?.wall
            if interval == nil {
                p.metrics = .off("scraping is off")
            } else if s.metricsOff {
                p.metrics = .off("metrics are off in this process")
            } else if let failure = s.failure {
                p.metrics = .failing(failure)
            } else if let last = s.last {
                p.metrics = .ok
                p.rates = s.rates
                p.callsInFlight = last.totals.callsInFlight
                p.connections = last.totals.connections
                p.outbox = last.totals.outbox
            } else {
                p.metrics = s.attempted ? .failing("failed") : .pending
            }
            processes.append(p)
        }
        let down = processes.filter { !$0.isGateway && $0.required && !$0.serving }.map(\.name)
        return StatusReport(generatedAt: now, interval: interval, processes: processes, requiredDown: down)
    }
}

/// The page's data at one moment (`StatusBoard.report`).
public struct StatusReport: Sendable {
    public var generatedAt: Date
    /// Scraping interval; nil when off.
    public var interval: Duration?
    /// The gateway first, then the upstreams in their configured order.
    public var processes: [ProcessStatus]
    /// Required upstreams that are not serving (the gateway's overall health is NOT_SERVING
    /// while any is).
    public var requiredDown: [String]
}

/// One process on the page.
public struct ProcessStatus: Sendable {
    public enum Metrics: Sendable, Equatable {
        /// No scrape yet.
        case pending
        case ok
        /// The last scrape failed (why, without addresses).
        case failing(String)
        case off(String)
    }

    public var name: String
    public var isGateway: Bool
    public var required: Bool
    /// Upstreams: answered their last health check. The gateway: its overall health.
    public var serving = false
    public var metrics: Metrics = .pending
    /// When the last successful scrape ended.
    public var lastScrape: Date?
    /// Between the last two successful scrapes; nil until there are two, or when the last failed.
    var rates: ProcessRates?
    public var callsInFlight: Double?
    public var connections: Double?
    /// The `outbox_*` gauges by destination; nil when the process has none.
    var outbox: [ProcessTotals.OutboxRow]?

    init(name: String, isGateway: Bool, required: Bool) {
        self.name = name
        self.isGateway = isGateway
        self.required = required
    }
}
