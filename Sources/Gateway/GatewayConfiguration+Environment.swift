import ArgumentParser
import RPCTLS
import RPCTransport
import ServiceKit

extension GatewayConfiguration {
    /// Settings from the command line and environment (`docs/gateway.md` lists every variable):
    /// the port and TLS from `ServiceOptions` (`GATEWAY_PORT`, `--tls-cert/--tls-key`), upstream
    /// addresses from `<SERVICE>_ADDR` / `<SERVICE>_PORT`, TLS towards them from `PEER_TLS_*` (read
    /// and checked by `ServiceSettings`), the rest from `GATEWAY_*`, read strictly
    /// through the kit's `Settings` (a malformed value refuses the start, naming the variable).
    public static func from(settings: ServiceSettings) throws -> GatewayConfiguration {
        try from(settings: settings, reading: settings.settings)
    }

    /// The same, with the `GATEWAY_*` settings read from `environment` (tests).
    public static func from(settings: ServiceSettings, environment: [String: String]) throws -> GatewayConfiguration {
        try from(settings: settings, reading: Settings(environment: environment))
    }

    static func from(settings: ServiceSettings, reading env: Settings) throws -> GatewayConfiguration {
        let upstreams = allUpstreams.map { name in
            let (host, port) = settings.peerAddress(name)
            return Upstream(name: name, host: host, port: port, tlsServerName: settings.peerTLSServerName(name))
        }
        var required = Set(allUpstreams)
        if let names = env.list("gateway.upstreams")?.map({ $0.lowercased() }) {
            for n in names where !allUpstreams.contains(n) {
                throw ValidationError("GATEWAY_UPSTREAMS: unknown service '\(n)' (known: \(allUpstreams.joined(separator: ", ")))")
            }
            required = Set(names)
        }
        var c = GatewayConfiguration(
            host: settings.host, port: settings.port, upstreams: upstreams, requiredUpstreams: required,
            gatewayToken: settings.gatewayToken)
        // The public port serves ordinary clients (browsers, apps): client certificates are for
        // the services' internal ports, where the gateway is the client.
        if settings.tlsClientCA != nil {
            throw ValidationError(
                "--tls-client-ca/GATEWAY_TLS_CLIENT_CA: the gateway's port is public and asks no client certificate; "
                    + "mutual TLS is for the services' ports (the gateway presents PEER_TLS_CERT to them)")
        }
        c.tls = try settings.serverTLS(alpn: ["h2", "http/1.1"])
        c.upstreamTLS = settings.peerTLS
        c.upstreamScrapeTLS = try ServiceSettings.peerTLS(settings.settings, alpn: ["http/1.1"])
        let unbounded = 0...Int.max
        if let n = try env.int("gateway.max.request.bytes", range: unbounded) { c.maxRequestBytes = max(1024, n) }
        if let n = try env.int("gateway.max.response.bytes", range: unbounded) { c.maxResponseBytes = max(1024, n) }
        if let n = try env.int("gateway.max.buffered.request.bytes", range: unbounded) { c.maxBufferedRequestBytes = max(64 * 1024, n) }
        if let n = try env.int("gateway.max.connections", range: unbounded) { c.maxConnections = max(1, n) }
        if let n = try env.int("gateway.max.concurrent.streams", range: unbounded) { c.maxConcurrentStreams = max(1, n) }
        if let n = try env.int("gateway.max.deadline.ms", range: unbounded) { c.maxDeadline = .milliseconds(max(1, n)) }
        if let n = try env.int("gateway.max.stream.deadline.ms", range: unbounded) { c.maxStreamDeadline = .milliseconds(max(1, n)) }
        if let n = try env.double("gateway.user.rate") { c.userRate = n }
        if let n = try env.double("gateway.user.burst") { c.userBurst = max(1, n) }
        if let n = try env.double("gateway.address.rate") { c.addressRate = n }
        if let n = try env.double("gateway.address.burst") { c.addressBurst = max(1, n) }
        if let n = try env.int("gateway.health.interval.ms", range: unbounded) { c.healthInterval = .milliseconds(max(100, n)) }
        if let n = try env.int("gateway.upstream.connect.timeout.ms", range: unbounded) { c.upstreamConnectTimeout = .milliseconds(max(10, n)) }
        if let n = try env.int("gateway.upstream.max.connections", range: 1...10_000) { c.upstreamMaxConnections = n }
        if let n = try env.int("gateway.threads", range: unbounded) { c.threads = max(1, n) }
        if let n = try env.int("gateway.status.scrape.ms", range: unbounded) { c.statusScrapeInterval = n == 0 ? nil : .milliseconds(max(100, n)) }
        c.metrics = settings.metrics
        c.accessLog = settings.accessLog
        if let token = env.string("gateway.metrics.token", secret: true) {
            guard token.utf8.count >= 16, !token.contains(" ") else {
                throw ValidationError("GATEWAY_METRICS_TOKEN must be at least 16 characters without spaces")
            }
            c.metricsToken = token
        }
        // The transport's connection settings, read as every service reads them (`<SERVICE>_*`, here
        // `GATEWAY_*`, or `SERVER_*`: keepalive, idle and age limits, HTTP/1.1 idle, TCP keepalive).
        // Only these: the gateway's limits (request bytes, connections, streams, threads) are
        // its own settings above, never overridden by a cluster-wide `SERVER_*`.
        c.connection = try ServiceHost.ConnectionSettings(settings)
        if env.string("gateway.http1.idle.ms") != nil {
            throw ValidationError("GATEWAY_HTTP1_IDLE_MS is now GATEWAY_HTTP1_IDLE_TIMEOUT_MS (as every process names it)")
        }
        let corsMaxAge = try env.int("gateway.cors.max.age.s", range: 0...CORSPolicy.maxMaxAge) ?? 600
        if let origins = env.list("gateway.cors.origins") {
            do { c.cors = try CORSPolicy(origins: origins, maxAge: corsMaxAge) } catch { throw ValidationError(error.description) }
        }
        return c
    }
}
