import Logging
import OTLPExport
import Observability
import RPCCore
import RPCProtobuf
import RPCServices
import RPCTLS
import RPCTransport
import ServiceLifecycle
import Storage
import Synchronization

/// Starts one service process the way every service starts, on swift-service-lifecycle: a
/// `ServiceGroup` of the gRPC server (the access policy interceptor, health and reflection) and
/// the background jobs (outbox delivery, upkeep). SIGTERM/SIGINT start a graceful shutdown in
/// reverse order: health turns NOT_SERVING and the server drains (GOAWAY, in-flight calls finish
/// within the grace period), then the background jobs are cancelled, then `run` returns and the
/// process exits 0. Executables are settings plus one call to `run`.
public enum ServiceHost {
    /// Sets up swift-log for the process from its settings: `LOG_LEVEL`, and `LOG_FORMAT` (text
    /// lines, or one JSON object per line on stderr: `JSONLogHandler`). `metadataProvider` adds
    /// context to every line; by default, when the process traces, the current span's `trace_id`
    /// and `span_id`.
    ///
    /// Tracing is set up first, from the same settings (`TRACE_EXPORT`, `TRACE_SAMPLE_RATIO`:
    /// `ProcessTracing.bootstrap`; `otlp://` and `otlps://` export through `OTLPExporter`), since
    /// the log lines need its context. A span file that cannot be opened leaves tracing off and
    /// says so in the log; it does not stop the process.
    ///
    /// `LoggingSystem.bootstrap` may run once per process: the first call sets logging up and
    /// later ones do nothing (tests that run services in-process never call this; they give
    /// each core its own `Logger`).
    public static func bootstrapLogging(_ settings: ServiceSettings, metadataProvider: Logger.MetadataProvider? = nil) {
        var tracingFailure: String?
        let tracer: SpanTracer?
        // The access log's lines carry the call's span only when they are written at all.
        let accessLines = settings.accessLog && (Logger.Level(rawValue: settings.logLevel) ?? .info) <= .info
        do {
            tracer = try ProcessTracing.bootstrap(settings.tracing, serviceName: settings.name, notesCalls: accessLines) { endpoint in
                // otlps:// trusts the cluster CA the process uses for its peers (PEER_TLS_CA), if any.
                try OTLPExporter(endpoint: endpoint, serviceName: settings.name, clusterTLS: settings.peerTLS)
            }
        } catch {
            tracer = nil
            tracingFailure = "\(error)"
        }
        bootstrapLogging(
            level: settings.logLevel, format: settings.logFormat,
            metadataProvider: metadataProvider ?? (tracer == nil ? nil : ProcessTracing.metadataProvider))
        if let tracingFailure { Logger(label: settings.name).error("tracing is off: \(tracingFailure)") }
    }

    public static func bootstrapLogging(level: String, format: LogFormat = .text, metadataProvider: Logger.MetadataProvider? = nil) {
        let first = loggingBootstrapped.withLock { done in
            defer { done = true }
            return !done
        }
        guard first else { return }
        let level = Logger.Level(rawValue: level) ?? .info
        LoggingSystem.bootstrap(
            { label, provider in
                switch format {
                case .text:
                    var h = StreamLogHandler.standardError(label: label, metadataProvider: provider)
                    h.logLevel = level
                    return h
                case .json:
                    return JSONLogHandler(label: label, level: level, output: .standardError, metadataProvider: provider)
                }
            }, metadataProvider: metadataProvider)
    }

    private static let loggingBootstrapped = Mutex(false)

    /// The outbox a service delivers: its database and who sends to each destination (by
    /// default every destination is a peer reached by RPC with the service credential).
    public struct Outbox: Sendable {
        public var database: Database
        public var senders: OutboxSenders?
        public var retry: OutboxRetryPolicy
        public init(database: Database, senders: OutboxSenders? = nil, retry: OutboxRetryPolicy = OutboxRetryPolicy()) {
            self.database = database
            self.senders = senders
            self.retry = retry
        }
    }

    /// Serves `services` until SIGTERM/SIGINT, with `background` jobs (each runs until cancelled)
    /// and the `outbox` delivered, then shuts down gracefully and returns. `beforeDrain` runs when
    /// the shutdown starts, before the server drains: a service with long-lived streams ends them
    /// there (UNAVAILABLE, so clients reconnect) instead of holding the drain for its grace period.
    public static func run(
        settings: ServiceSettings, services: [any RPCService], descriptors: ProtoDescriptorSet,
        keys: any SigningKeySource, logger: Logger,
        background: [@Sendable () async -> Void] = [],
        outbox: Outbox? = nil, peers: PeerClients? = nil,
        configure: (inout ServerConfiguration) -> Void = { _ in },
        beforeDrain: @escaping @Sendable () -> Void = {}
    ) async throws {
        let serverService = try self.serverService(
            settings: settings, services: services, descriptors: descriptors, keys: keys, logger: logger, configure: configure,
            beforeDrain: beforeDrain, erased: try outbox.map { try ErasedUsers.of($0.database) })
        let peers = peers ?? PeerClients(settings: settings)

        var jobs = background
        if let outbox {
            let delivery = OutboxDelivery(
                database: outbox.database, retry: try settings.outboxRetry(outbox.retry), logger: logger,
                deliver: (outbox.senders ?? .rpc(peers: peers)).deliver)
            jobs.append { await delivery.run() }
        }
        ShutdownSignals.install()  // SIGTERM ignored (kept for the group) before we say we listen
        // Reverse order on shutdown: the server drains first, then the jobs stop.
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: jobs.map {
                    // A job ends only when cancelled: one that returns by itself is a bug, and the
                    // process shuts down gracefully rather than serve without it.
                    .init(
                        service: BackgroundJob(job: $0), successTerminationBehavior: .gracefullyShutdownGroup,
                        failureTerminationBehavior: .gracefullyShutdownGroup)
                }
                    + [
                        .init(service: serverService)
                    ],
                gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        // The spans still buffered are written however the group ends (a failed job throws).
        defer { ProcessTracing.shutdown() }
        try await group.run()
        await peers.close()
        logger.info("stopped")
    }

    /// The process's gRPC server (the access policy, health and reflection, `settings`' address,
    /// TLS and limits) and, with `settings.healthPort`, its health-only listener, as one lifecycle
    /// service: both start when it runs and stop on graceful shutdown.
    static func serverService(
        settings: ServiceSettings, services: [any RPCService], descriptors: ProtoDescriptorSet, keys: any SigningKeySource,
        logger: Logger, configure: (inout ServerConfiguration) -> Void = { _ in }, beforeDrain: @escaping @Sendable () -> Void = {},
        erased: ErasedUsers? = nil
    ) throws -> ServerService {
        var config = try serverConfiguration(settings: settings)
        config.interceptors = [
            AuthInterceptor(keys: keys, serviceToken: settings.serviceToken, gatewayToken: settings.gatewayToken, erased: erased)
        ]
        addObservers(settings, to: &config)
        configure(&config)
        try applyServerSettings(settings, to: &config)
        // Traced: every call to the service's own methods runs in a server span, outermost, so
        // calls the policy refuses are spans too (health and reflection are not: probes would
        // fill the traces).
        if let tracer = ProcessTracing.tracer {
            config.interceptors.insert(TracingInterceptor(tracer: tracer, untraced: AuthInterceptor.open), at: 0)
        }
        let (health, all) = StandardServices.make(for: services, descriptors: descriptors)
        let server = RPCServer(configuration: config, services: all, logger: logger)
        return ServerService(
            server: server, healthServer: settings.healthPort.map { healthServer(health, host: settings.host, port: $0, logger: logger) },
            health: health, settings: settings, logger: logger, beforeDrain: beforeDrain)
    }

    /// The health-only listener (`--health-port`): plaintext h2c on `host`, serving `health` (the
    /// main server's own, so the same statuses) and nothing else, with no interceptor (health is
    /// open on the main port as well). Any other method answers UNIMPLEMENTED. One event loop, a
    /// few connections: probes only.
    static func healthServer(_ health: HealthService, host: String, port: Int, logger: Logger) -> RPCServer {
        var config = ServerConfiguration(host: host, port: port, tls: nil)
        config.threads = 1
        config.maxConnections = 64
        config.maxConcurrentStreams = 16
        // It stops after the main server has drained; a probe's `Watch` stream never ends by
        // itself, so a long grace here would only add to the pod's termination time.
        config.shutdownGracePeriod = .milliseconds(500)
        return RPCServer(configuration: config, services: [health], logger: logger)
    }

    /// Every call counted and timed (`RPCServerMetrics`), and `GET /metrics` on the server's own
    /// port, over HTTP/1.1 or HTTP/2 (docs/observability.md).
    public static func addMetrics(to config: inout ServerConfiguration) {
        config.observer = ServerCallObservers.combine([config.observer, RPCServerMetrics()].compactMap { $0 })
        config.httpHandler = MetricsEndpoint()
        config.acceptHTTP1 = true
    }

    /// What the settings ask for: metrics (`METRICS`) and one access-log line per call (`ACCESS_LOG`).
    public static func addObservers(_ settings: ServiceSettings, to config: inout ServerConfiguration) {
        if settings.metrics { addMetrics(to: &config) }
        if let log = AccessLog(settings: settings).flatMap({ AccessLogObserver($0) }) {
            config.observer = ServerCallObservers.combine([config.observer, log].compactMap { $0 })
        }
    }

    /// The server settings every process shares: address and TLS (mutual TLS with
    /// `--tls-client-ca`: only peers with a certificate from the cluster CA get in). With metrics
    /// the port also answers HTTP/1.1 (`GET /metrics`, `addMetrics`), so TLS offers `http/1.1`
    /// after `h2`: gRPC clients still get h2 (the server's preference), a scraper speaking only
    /// HTTP/1.1 is not refused by ALPN.
    public static func serverConfiguration(settings: ServiceSettings) throws -> ServerConfiguration {
        let alpn = settings.metrics ? ["h2", "http/1.1"] : ["h2"]
        return ServerConfiguration(host: settings.host, port: settings.port, tls: try settings.serverTLS(alpn: alpn))
    }

    /// The transport's limits and connection management from the environment, each
    /// `<SERVICE>_<NAME>` for one process or `SERVER_<NAME>` for every process (docs/architecture.md,
    /// "Server settings"); unset ones keep the transport's (or the service's) defaults. Durations
    /// are milliseconds; 0 turns an optional timer off.
    public static func applyServerSettings(_ settings: ServiceSettings, to config: inout ServerConfiguration) throws {
        let s = settings.settings, name = settings.name
        func int(_ key: String, _ range: ClosedRange<Int>) throws -> Int? {
            try s.int("\(name).\(key)", range: range) ?? s.int("server.\(key)", range: range)
        }
        if let n = try int("max.connections", 1...10_000_000) { config.maxConnections = n }
        if let n = try int("max.concurrent.streams", 1...100_000) { config.maxConcurrentStreams = n }
        if let n = try int("max.request.bytes", 1024...(1 << 30)) { config.maxReceiveMessageSize = n }
        if let n = try int("max.buffered.request.bytes.per.connection", 64 * 1024...(1 << 30)) { config.maxBufferedRequestBytesPerConnection = n }
        if let n = try int("max.buffered.request.bytes", 64 * 1024...(1 << 32)) { config.maxBufferedRequestBytesPerProcess = n }
        if let n = try int("initial.window.bytes", 16 * 1024...Int(Int32.max)) { config.initialWindowSize = n }
        if let n = try int("threads", 1...256) { config.threads = n }
        try ConnectionSettings(settings).apply(to: &config)
    }

    /// How long connections live and how they are kept alive (`<SERVICE>_*` or `SERVER_*`:
    /// first-request timeout, keepalive PINGs, idle and age limits, HTTP/1.1 idle, TCP
    /// keepalive), read and checked once; nil leaves the transport's default. The gateway reads
    /// only these from the shared names: its limits have settings of their own.
    public struct ConnectionSettings: Sendable {
        var firstRequestTimeout: Duration??
        var keepaliveTime: Duration??
        var keepaliveTimeout: Duration?
        var maxConnectionIdle: Duration??
        var maxConnectionAge: Duration??
        var maxConnectionAgeGrace: Duration?
        var http1IdleTimeout: Duration??
        var tcpKeepaliveIdle: Duration??

        public init(_ settings: ServiceSettings) throws {
            let s = settings.settings, name = settings.name
            func int(_ key: String, _ range: ClosedRange<Int>) throws -> Int? {
                try s.int("\(name).\(key)", range: range) ?? s.int("server.\(key)", range: range)
            }
            // Milliseconds; 0 turns the timer off (`.some(nil)`), unset keeps the default (nil).
            func optionalTimer(_ key: String) throws -> Duration?? {
                guard let ms = try int(key, 0...Int(Int32.max)) else { return nil }
                return .some(ms == 0 ? nil : .milliseconds(ms))
            }
            firstRequestTimeout = try optionalTimer("first.request.timeout.ms")
            keepaliveTime = try optionalTimer("keepalive.time.ms")
            keepaliveTimeout = try int("keepalive.timeout.ms", 1...Int(Int32.max)).map { .milliseconds($0) }
            maxConnectionIdle = try optionalTimer("max.connection.idle.ms")
            maxConnectionAge = try optionalTimer("max.connection.age.ms")
            maxConnectionAgeGrace = try int("max.connection.age.grace.ms", 0...Int(Int32.max)).map { .milliseconds($0) }
            http1IdleTimeout = try optionalTimer("http1.idle.timeout.ms")
            tcpKeepaliveIdle = try int("tcp.keepalive.s", 0...86_400).map { $0 == 0 ? nil : .seconds($0) }
        }

        public func apply(to config: inout ServerConfiguration) {
            if let t = firstRequestTimeout { config.firstRequestTimeout = t }
            if let t = keepaliveTime { config.keepaliveTime = t }
            if let t = keepaliveTimeout { config.keepaliveTimeout = t }
            if let t = maxConnectionIdle { config.maxConnectionIdle = t }
            if let t = maxConnectionAge { config.maxConnectionAge = t }
            if let t = maxConnectionAgeGrace { config.maxConnectionAgeGrace = t }
            if let t = http1IdleTimeout { config.http1IdleTimeout = t }
            if let t = tcpKeepaliveIdle { config.tcpKeepaliveIdle = t }
        }
    }

    /// A client for another service of the cluster, carrying the service credential.
    public static func peerClient(_ peer: String, settings: ServiceSettings) -> RPCClient {
        let channel = RPCChannel(configuration: settings.peerChannelConfiguration(peer))
        return RPCClient(transport: peerInterceptors(channel, serviceToken: settings.serviceToken, tracer: ProcessTracing.tracer))
    }
}

/// The gRPC server as a lifecycle service: listens when run, drains on graceful shutdown.
/// With a health port, the health-only listener starts after the main server and stops after it
/// has drained: probes read NOT_SERVING during the drain rather than a refused connection.
struct ServerService: Service, CustomStringConvertible {
    let server: RPCServer
    let healthServer: RPCServer?
    let health: HealthService
    let settings: ServiceSettings
    let logger: Logger
    var beforeDrain: @Sendable () -> Void = {}
    /// The bound ports once listening (main, health): what port 0 became (tests).
    let bound = BoundPorts()

    final class BoundPorts: Sendable {
        let ports = Mutex<(main: Int, health: Int?)?>(nil)
    }

    var description: String { "\(settings.name) gRPC server" }

    func run() async throws {
        let port = try await server.start()
        var healthPort: Int?
        if let healthServer {
            do {
                healthPort = try await healthServer.start()
            } catch {
                await server.shutdownGracefully()
                await healthServer.shutdownGracefully()
                throw error  // `ListenError`: the health port's address
            }
        }
        bound.ports.withLock { $0 = (port, healthPort) }
        logger.info(
            "\(settings.name) listening on \(settings.host):\(port)\(healthPort.map { ", health (h2c) on \(settings.host):\($0)" } ?? "") (data: \(settings.dataDir))"
        )
        // Until SIGTERM/SIGINT (or the group is cancelled: a background job failed).
        try? await gracefulShutdown()
        logger.info("shutting down gracefully")
        health.markAllNotServing()
        beforeDrain()
        await server.shutdownGracefully()
        await healthServer?.shutdownGracefully()
    }
}

/// A loop that runs until cancelled (outbox delivery, upkeep), cancelled on graceful shutdown.
struct BackgroundJob: Service, CustomStringConvertible {
    let job: @Sendable () async -> Void
    var description: String { "background job" }
    func run() async throws {
        await cancelWhenGracefulShutdown(job)
    }
}
