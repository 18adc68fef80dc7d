import ArgumentParser
import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCTLS
import RPCTransport
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Gateway

/// The gateway towards services that speak mutual TLS (issue 20): its upstream pools verify the
/// services against the cluster CA (`PEER_TLS_CA`) and present the gateway's client certificate
/// (`PEER_TLS_CERT`/`PEER_TLS_KEY`); its own public port stays open to ordinary clients.
@Suite struct UpstreamTLSTests {
    /// A gateway configured as the executable is (settings → `GatewayConfiguration.from`), in front
    /// of the upstream "accounts" at `port`, with `environment` on top; reached over h2c.
    static func gateway(accountsPort port: Int, _ environment: [String: String], _ arguments: [String] = []) async throws -> (Gateway, RPCChannel) {
        var env = [
            "GATEWAY_TOKEN": Fake.gatewayToken, "ALLOW_DEV_CREDENTIALS": "1", "ACCOUNTS_ADDR": "127.0.0.1:\(port)",
            "GATEWAY_UPSTREAMS": "accounts", "GATEWAY_THREADS": "1",
        ]
        for (k, v) in environment { env[k] = v }
        let settings = try ServiceSettings(
            name: "gateway", options: try ServiceOptions.parse(["--port", "0"] + arguments), environment: env, credentials: .gateway)
        var config = try GatewayConfiguration.from(settings: settings)
        config.upstreams = config.upstreams.filter { $0.name == "accounts" }
        var logger = Logger(label: "gateway-tls-test")
        logger.logLevel = .critical
        let gateway = try Gateway(configuration: config, logger: logger)
        let port = try await gateway.start()
        return (gateway, RPCChannel(host: "127.0.0.1", port: port))
    }

    static func logIn(_ channel: RPCChannel) async throws -> Accounts_V1_LogInResponse {
        var request = Accounts_V1_LogInRequest()
        request.username = "ada"
        request.password = "pw"
        return try await Accounts_V1_AccountsClient(channel.client).logIn(request, options: CallOptions(timeout: .seconds(10)))
    }

    @Test func theGatewayRelaysToAMutualTLSUpstreamPresentingItsCertificate() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let keys = KeyStore([])
        let recorder = Recorder()
        let upstreamTLS = try TLSConfiguration.server(
            certificateChainPEMFile: certs.certFile("accounts"), privateKeyPEMFile: certs.keyFile("accounts"), alpn: ["h2"],
            clientCertificateAuthorityPEMFile: certs.caFile)
        let accounts = try await FakeUpstream(services: [Fake.Accounts(keys: keys, recorder: recorder)], keys: keys, tls: upstreamTLS)

        // With the gateway's certificate: relayed, and the upstream saw the gateway's credential.
        let (gateway, channel) = try await Self.gateway(accountsPort: accounts.port, certs.peerEnvironment(as: "gateway"))
        #expect(gateway.configuration.upstreamTLS?.presentsCertificate == true)
        let r = try await Self.logIn(channel)
        #expect(r.session.accessToken == "token-for-ada")
        #expect(recorder.last(Accounts_V1_AccountsMethods.logIn.path)?["x-gateway-token"] == Fake.gatewayToken)
        // Its aggregated health reaches the upstream over the same TLS.
        var whole = Grpc_Health_V1_HealthCheckRequest()
        whole.service = ""
        #expect(try await Grpc_Health_V1_HealthClient(channel.client).check(whole).status == .serving)
        await channel.close()
        await gateway.shutdown()

        // Without a client certificate the upstream refuses the gateway: the client is told
        // UNAVAILABLE, the gateway's operators why (its health, its log).
        let (bare, bareChannel) = try await Self.gateway(accountsPort: accounts.port, certs.peerEnvironment(as: nil))
        let refused = await expectFailure(.unavailable) { try await Self.logIn(bareChannel) }
        #expect(refused?.message == "accounts is unavailable right now: try again shortly", "\(refused?.message ?? "")")
        await bare.health.poll()
        let why = bare.health.failure(upstream: "accounts")
        #expect(why?.contains("requires a client certificate") == true, "\(why ?? "")")
        await bareChannel.close()
        await bare.shutdown()

        // With a certificate from another CA, likewise.
        var rogue = certs.peerEnvironment(as: "rogue")
        rogue["PEER_TLS_CA"] = certs.caFile
        let (other, otherChannel) = try await Self.gateway(accountsPort: accounts.port, rogue)
        let rejected = await expectFailure(.unavailable) { try await Self.logIn(otherChannel) }
        #expect(rejected?.message == "accounts is unavailable right now: try again shortly", "\(rejected?.message ?? "")")
        await other.health.poll()
        let untrusted = other.health.failure(upstream: "accounts")
        #expect(untrusted?.contains("does not trust the CA") == true, "\(untrusted ?? "")")
        await otherChannel.close()
        await other.shutdown()
        await accounts.stop()
    }

    @Test func theGatewaysPublicPortAsksNoClientCertificate() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        await #expect {
            _ = try await Self.gateway(accountsPort: 1, [:], certs.serverArguments("gateway", mutual: true))
        } throws: { "\($0)".contains("--tls-client-ca/GATEWAY_TLS_CLIENT_CA: the gateway's port is public") }
    }
}

/// The status page scrapes `/metrics` over the cluster's TLS when `PEER_TLS_*` is set: HTTP/1.1
/// by ALPN, the gateway's client certificate presented to a mutual-TLS port.
@Suite struct StatusScrapeTLSTests {
    @Test func metricsAreFetchedOverMutualTLSWithTheGatewaysCertificate() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.tls = try TLSConfiguration.server(
            certificateChainPEMFile: certs.certFile("accounts"), privateKeyPEMFile: certs.keyFile("accounts"), alpn: ["h2", "http/1.1"],
            clientCertificateAuthorityPEMFile: certs.caFile)
        ServiceHost.addMetrics(to: &config)
        let server = RPCServer(configuration: config, services: [])
        let port = try await server.start()
        defer { Task { await server.shutdownGracefully() } }

        func scrapeTLS(as name: String?) throws -> TLSConfiguration? {
            try ServiceSettings.peerTLS(Settings(environment: certs.peerEnvironment(as: name)), alpn: ["http/1.1"])
        }
        let body = try await MetricsFetch.get(
            host: "127.0.0.1", port: port, timeout: .seconds(5), tls: try scrapeTLS(as: "gateway"), serverName: "accounts")
        #expect(String(decoding: body, as: UTF8.self).contains("# TYPE"))
        // Without a client certificate the port refuses; cleartext too.
        await #expect(throws: (any Error).self) {
            _ = try await MetricsFetch.get(host: "127.0.0.1", port: port, timeout: .seconds(5), tls: try scrapeTLS(as: nil), serverName: "accounts")
        }
        await #expect(throws: (any Error).self) {
            _ = try await MetricsFetch.get(host: "127.0.0.1", port: port, timeout: .seconds(5))
        }
    }
}
