import Contracts
import GRPCContracts
import Logging
import NIOCore
import NIOPosix
import Observability
import RPCCore
import RPCServices
import RPCTransport
import ServiceKit
import Synchronization

/// The public entry point of the cluster: one port serving gRPC (h2c or TLS), Connect JSON over
/// HTTP/1.1 and HTTP/2, and a status page. Every public RPC of every service is relayed to its
/// upstream service; internal RPCs are not routed at all. See `docs/gateway.md`.
public final class Gateway: Sendable {
    public let configuration: GatewayConfiguration
    public let health: GatewayHealth
    /// What `GET /status` shows: health and every process's metrics, scraped in the background.
    public let status: StatusBoard
    let pools: [String: UpstreamPool]
    let server: RPCServer
    let ownGroup: MultiThreadedEventLoopGroup
    let logger: Logger
    private let background = Mutex<Task<Void, Never>?>(nil)

    /// The descriptors the gateway routes and transcodes from: our contracts and the standard ones.
    public static var descriptors: ProtoDescriptorSet {
        ContractsDescriptors.descriptorSet.merging(GRPCContractsDescriptors.descriptorSet)
    }

    /// `accounts.v1.Accounts` → `accounts`: services are named after their package's first part.
    public static func upstreamName(ofService service: String) -> String {
        String(service.split(separator: ".").first ?? "")
    }

    /// The public services of the contracts (every service not named `*Internal`) and their methods
    /// not marked internal, read from the descriptors.
    public static func publicRoutes(_ registry: SchemaRegistry) -> [String: [MethodDescriptor]] {
        var out: [String: [MethodDescriptor]] = [:]
        for service in ContractsDescriptors.services where !service.hasSuffix("Internal") {
            let methods = registry.methods(of: service).filter { $0.visibility != .internal }
            if !methods.isEmpty { out[service] = methods }
        }
        return out
    }

    /// - Parameter extraRoutes: more services to relay, by service name, with the upstream
    ///   serving them (tests use it for call kinds no public contract has yet).
    public init(
        configuration: GatewayConfiguration, logger: Logger = Logger(label: "gateway"),
        extraRoutes: [String: (upstream: String, methods: [MethodDescriptor])] = [:]
    ) throws {
        self.configuration = configuration
        self.logger = logger
        let descriptors = Self.descriptors
        let registry = try SchemaRegistry(descriptors)
        ownGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        // The serving loops, made here so that each upstream pool keeps per-loop connections.
        let serverGroup = MultiThreadedEventLoopGroup(numberOfThreads: max(1, configuration.threads ?? System.coreCount))
        let serverLoops = Array(serverGroup.makeIterator())

        var pools: [String: UpstreamPool] = [:]
        for u in configuration.upstreams {
            var channel = ChannelConfiguration(host: u.host, port: u.port, tls: configuration.upstreamTLS)
            channel.tlsServerName = u.tlsServerName
            channel.connectTimeout = configuration.upstreamConnectTimeout
            channel.maxBackoff = configuration.upstreamMaxBackoff
            channel.initialBackoff = .milliseconds(50)
            // Partial messages' bytes are released as they arrive, so the window need not hold
            // the largest response (a 1 MiB avatar): the default 1 MiB keeps a relay at full
            // speed. (It opened per complete message once, and had to.)
            channel.maxReceiveMessageSize = configuration.maxResponseBytes
            channel.keepaliveTime = configuration.upstreamKeepaliveTime
            channel.keepaliveTimeout = configuration.upstreamKeepaliveTimeout
            // The gateway's credential goes with every call to the services, its own (the signing
            // keys' fetch, health) included: encoded once per upstream connection.
            if !configuration.gatewayToken.isEmpty {
                channel.metadata.add(CredentialCheck.gatewayTokenHeader, configuration.gatewayToken)
            }
            pools[u.name] = UpstreamPool(
                name: u.name, configuration: channel, loops: serverLoops, fallbackLoop: ownGroup.next(),
                streamsPerConnection: configuration.streamsPerUpstreamConnection, maxConnectionsPerLoop: configuration.upstreamMaxConnections)
        }
        self.pools = pools

        let keys: any SigningKeySource =
            pools["accounts"].map {
                RemoteSigningKeys(client: RPCClient(transport: $0), minRefreshInterval: configuration.keyRefreshInterval, logger: logger)
            } ?? StaticSigningKeys { [:] }
        // The gateway never accepts a credential from outside (it strips them), so it holds none
        // to check: it only verifies users' tokens.
        let verifier = AuthInterceptor(keys: keys, serviceToken: "")
        // One line per call, unless off or hidden by the log level (then nothing is noted for it).
        let accessLog = configuration.accessLog ? AccessLogObserver(AccessLog()) : nil
        let policy = GatewayPolicy(
            verifier: verifier,
            addressLimiter: configuration.addressRate > 0 ? RateLimiter(rate: configuration.addressRate, burst: configuration.addressBurst) : nil,
            userLimiter: configuration.userRate > 0 ? RateLimiter(rate: configuration.userRate, burst: configuration.userBurst) : nil,
            notesIdentity: accessLog != nil)

        // Routes: one proxy per public service whose upstream is configured.
        var services: [any RPCService] = []
        var healthUpstreams: [String: [String]] = [:]
        var table = Self.publicRoutes(registry).mapValues { (upstream: "", methods: $0) }
        for (service, route) in extraRoutes { table[service] = route }
        for (service, route) in table.sorted(by: { $0.key < $1.key }) {
            let methods = route.methods
            let upstream = route.upstream.isEmpty ? Self.upstreamName(ofService: service) : route.upstream
            guard let pool = pools[upstream] else { continue }
            // Unary calls are relayed without a context when nothing needs one (no access log;
            // with a tracer, the calls it does not trace): the policy then decides alone, and
            // the relay applies it itself.
            let proxy = Proxy(
                pool: pool, maxDeadline: configuration.maxDeadline,
                maxStreamDeadline: configuration.maxStreamDeadline, tracer: configuration.tracer,
                relayPolicy: accessLog == nil ? policy : nil)
            services.append(ProxyService(serviceName: service, methods: methods.map { ServerMethod($0, proxy.handler(for: $0)) }))
            healthUpstreams[upstream, default: []].append(service)
        }

        health = GatewayHealth(
            upstreams: healthUpstreams.sorted(by: { $0.key < $1.key }).map { name, services in
                GatewayHealth.Upstream(name: name, transport: pools[name]!, services: services)
            },
            required: configuration.requiredUpstreams, timeout: configuration.upstreamConnectTimeout, logger: logger)
        status = Self.statusBoard(configuration: configuration, health: health, loop: ownGroup.next(), logger: logger)
        let publicNames = services.map(\.serviceName)
        let index = ReflectionIndex(descriptors: descriptors, services: publicNames + StandardServices.standardNames)
        services += [health] + StandardServices.reflection(index: index)

        var config = ServerConfiguration(host: configuration.host, port: configuration.port, tls: configuration.tls)
        config.acceptHTTP1 = true
        // Each method's own limit (from the contracts) applies below this one; this one lets
        // the largest method through (5 MiB attachments). Stream windows stay at the transport's
        // default: large messages are admitted against the request budgets instead.
        config.maxReceiveMessageSize = configuration.maxRequestBytes
        config.maxBufferedRequestBytesPerConnection = configuration.maxRequestBytes + 64 * 1024
        config.maxBufferedRequestBytesPerProcess = configuration.maxBufferedRequestBytes
        config.maxConcurrentStreams = configuration.maxConcurrentStreams
        config.maxConnections = configuration.maxConnections
        config.threads = serverLoops.count
        // Traced: the gateway's span outermost, so calls the policy refuses are spans too.
        let tracing: [any ServerInterceptor] =
            configuration.tracer.map {
                [TracingInterceptor(tracer: $0, role: .relay, untraced: AuthInterceptor.open)]
            } ?? []
        config.interceptors = tracing + [policy]
        config.observer = ServerCallObservers.combine(
            (configuration.metrics ? [RPCServerMetrics()] : []) + (accessLog.map { [$0] } ?? []))
        let health = self.health
        let upstreamList = configuration.upstreams
        // Browser calls (gRPC-Web, Connect) end in the HTTP handler, not in the gRPC transport:
        // they are told to the same observers (metrics, access log) by an interceptor.
        let observing = config.observer.map { ObservingInterceptor($0) }
        var connect = ConnectHandler(
            router: Router(services: services), interceptors: ServerInterceptors((observing.map { [$0] } ?? []) + tracing + [policy]),
            transcoder: JSONTranscoder(registry: registry), logger: logger,
            statusPage: { await Self.statusPage(health: health, upstreams: upstreamList, services: publicNames) })
        connect.observing = observing
        connect.maxRequestBytes = configuration.maxRequestBytes
        connect.cors = configuration.cors
        connect.metrics = configuration.metrics
        connect.metricsAccess = MetricsAccess(token: configuration.metricsToken)
        connect.sideEffectFree = registry.sideEffectFreePaths
        connect.status = status
        config.httpHandler = connect
        configuration.connection?.apply(to: &config)
        configuration.adjustServer(&config)
        server = RPCServer(configuration: config, services: services, logger: logger, group: serverGroup)
    }

    /// Binds the port and starts polling upstream health; returns the bound port.
    @discardableResult
    public func start() async throws -> Int {
        let port = try await server.start()
        let health = self.health
        let status = self.status
        let interval = configuration.healthInterval
        background.withLock {
            $0 = Task {
                await withTaskGroup(of: Void.self) { group in
                    group.addTask { await health.run(interval: interval) }
                    group.addTask { await status.run() }
                }
            }
        }
        logger.info(
            "gateway listening on \(configuration.host):\(port) (gRPC, Connect JSON; HTTP/2 and HTTP/1.1\(configuration.tls == nil ? "" : ", TLS"))")
        return port
    }

    /// Serves until SIGTERM/SIGINT, then shuts down gracefully.
    public func runUntilSignalled() async {
        await server.runUntilSignalled(logger: logger) { [health] in health.markAllNotServing() }
        await stopBackground()
    }

    /// Graceful shutdown (tests): GOAWAY, in-flight calls finish, connections close.
    public func shutdown() async {
        health.markAllNotServing()
        await server.shutdownGracefully()
        await stopBackground()
    }

    private func stopBackground() async {
        let task = background.withLock { t in
            defer { t = nil }; return t
        }
        task?.cancel()
        await task?.value
        for pool in pools.values { await pool.close() }
        try? await ownGroup.shutdownGracefully()
    }

    /// Calls in flight to each upstream (tests, status page).
    public func activeUpstreamCalls(_ upstream: String) -> Int { pools[upstream]?.activeCalls ?? 0 }

    /// The status page's board: the gateway itself (its own registry, read in place), then every
    /// configured upstream's `GET /metrics` on its gRPC port, fetched on the gateway's own loop.
    static func statusBoard(configuration c: GatewayConfiguration, health: GatewayHealth, loop: any EventLoop, logger: Logger) -> StatusBoard {
        let metrics = c.metrics
        var targets = [StatusBoard.Target(name: "gateway", source: .local { metrics ? ProcessMetrics.expositionBytes() : nil })]
        var serverNames: [String: String] = [:]
        for u in c.upstreams {
            targets.append(
                StatusBoard.Target(name: u.name, source: .http(host: u.host, port: u.port), required: c.requiredUpstreams.contains(u.name)))
            serverNames["\(u.host):\(u.port)"] = u.tlsServerName
        }
        let tls = c.upstreamScrapeTLS
        return StatusBoard(
            targets: targets, interval: c.statusScrapeInterval, timeout: StatusBoard.timeout(for: c.statusScrapeInterval ?? .seconds(10)),
            serving: { name in name == "gateway" ? health.overall == .serving : health.isServing(upstream: name) }, logger: logger,
            fetch: { [serverNames] host, port, timeout in
                try await MetricsFetch.get(
                    host: host, port: port, timeout: timeout, tls: tls, serverName: serverNames["\(host):\(port)"], on: loop)
            })
    }

    static func statusPage(
        health: GatewayHealth, upstreams: [GatewayConfiguration.Upstream],
        services: [String]
    ) async -> (serving: Bool, text: String) {
        await health.refreshIfStale()
        let serving = health.overall == .serving
        var lines = [
            "backend gateway: \(serving ? "SERVING" : "NOT SERVING")", "",
            "gRPC (h2c/TLS) and Connect JSON (POST /<package>.<Service>/<Method>) on this port.", "", "upstreams:",
        ]
        for u in upstreams {
            lines.append("  \(u.name)  \(u.host):\(u.port)  \(health.isServing(upstream: u.name) ? "serving" : "not serving")")
        }
        lines.append("")
        lines.append("services:")
        for s in services { lines.append("  \(s)") }
        return (serving, lines.joined(separator: "\n") + "\n")
    }
}
