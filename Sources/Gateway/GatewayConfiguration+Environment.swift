import ArgumentParser
import RPCTLS
import ServiceKit

extension GatewayConfiguration {
    /// Settings from the command line and environment (`docs/gateway.md` lists every variable):
    /// the port and TLS from `ServiceOptions` (`GATEWAY_PORT`, `--tls-cert/--tls-key`), upstream
    /// addresses from `<SERVICE>_ADDR` / `<SERVICE>_PORT`, the rest from `GATEWAY_*`.
    public static func from(settings: ServiceSettings, environment: [String: String]) throws -> GatewayConfiguration {
        let upstreams = allUpstreams.map { name in
            let (host, port) = settings.peerAddress(name)
            return Upstream(name: name, host: host, port: port)
        }
        var required = Set(allUpstreams)
        if let list = environment["GATEWAY_UPSTREAMS"] {
            let names = list.split(separator: ",").map { $0.trimmingCharacters(in: " ").lowercased() }.filter { !$0.isEmpty }
            for n in names where !allUpstreams.contains(n) {
                throw ValidationError("GATEWAY_UPSTREAMS: unknown service '\(n)' (known: \(allUpstreams.joined(separator: ", ")))")
            }
            required = Set(names)
        }
        var c = GatewayConfiguration(host: settings.host, port: settings.port, upstreams: upstreams, requiredUpstreams: required,
                                     serviceToken: settings.serviceToken)
        if let cert = settings.tlsCert, let key = settings.tlsKey {
            c.tls = try TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: ["h2", "http/1.1"])
        }
        func int(_ name: String) throws -> Int? {
            guard let v = environment[name] else { return nil }
            guard let n = Int(v), n >= 0 else { throw ValidationError("\(name) must be a non-negative integer, got '\(v)'") }
            return n
        }
        func double(_ name: String) throws -> Double? {
            guard let v = environment[name] else { return nil }
            guard let n = Double(v), n >= 0 else { throw ValidationError("\(name) must be a non-negative number, got '\(v)'") }
            return n
        }
        if let n = try int("GATEWAY_MAX_REQUEST_BYTES") { c.maxRequestBytes = max(1024, n) }
        if let n = try int("GATEWAY_MAX_RESPONSE_BYTES") { c.maxResponseBytes = max(1024, n) }
        if let n = try int("GATEWAY_MAX_BUFFERED_REQUEST_BYTES") { c.maxBufferedRequestBytes = max(64 * 1024, n) }
        if let n = try int("GATEWAY_MAX_CONNECTIONS") { c.maxConnections = max(1, n) }
        if let n = try int("GATEWAY_MAX_CONCURRENT_STREAMS") { c.maxConcurrentStreams = max(1, n) }
        if let n = try int("GATEWAY_MAX_DEADLINE_MS") { c.maxDeadline = .milliseconds(max(1, n)) }
        if let n = try int("GATEWAY_MAX_STREAM_DEADLINE_MS") { c.maxStreamDeadline = .milliseconds(max(1, n)) }
        if let n = try double("GATEWAY_USER_RATE") { c.userRate = n }
        if let n = try double("GATEWAY_USER_BURST") { c.userBurst = max(1, n) }
        if let n = try double("GATEWAY_ADDRESS_RATE") { c.addressRate = n }
        if let n = try double("GATEWAY_ADDRESS_BURST") { c.addressBurst = max(1, n) }
        if let n = try int("GATEWAY_HEALTH_INTERVAL_MS") { c.healthInterval = .milliseconds(max(100, n)) }
        if let n = try int("GATEWAY_UPSTREAM_CONNECT_TIMEOUT_MS") { c.upstreamConnectTimeout = .milliseconds(max(10, n)) }
        if let n = try int("GATEWAY_THREADS") { c.threads = max(1, n) }
        return c
    }
}
