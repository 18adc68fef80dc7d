import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCTransport
import ServiceKitTesting
import ServiceLifecycle
import Testing

@testable import ServiceKit

/// `--health-port` (issue 20, native gRPC probes under mutual TLS): a second, plaintext listener
/// serving grpc.health.v1.Health alone, with the main server's statuses, started and stopped with
/// it by `ServiceHost`'s server service; the main port keeps its TLS and its access policy.
@Suite struct HealthPortTests {
    static func health(_ client: RPCClient, _ service: String = "") async throws -> Grpc_Health_V1_HealthCheckResponse.ServingStatus {
        var request = Grpc_Health_V1_HealthCheckRequest()
        request.service = service
        return try await Grpc_Health_V1_HealthClient(client).check(request, options: CallOptions(timeout: .seconds(10))).status
    }

    @Test func theHealthPortSettingIsReadLikeThePort() throws {
        #expect(try PeerTLSTests.settings("accounts").healthPort == nil, "off by default")
        #expect(try PeerTLSTests.settings("accounts", [:], ["--health-port", "9111"]).healthPort == 9111)
        #expect(try PeerTLSTests.settings("accounts", ["ACCOUNTS_HEALTH_PORT": "9112", "HEALTH_PORT": "9113"]).healthPort == 9112)
        #expect(try PeerTLSTests.settings("accounts", ["HEALTH_PORT": "9113"]).healthPort == 9113)
        #expect(try PeerTLSTests.settings("accounts", ["HEALTH_PORT": "9113"], ["--health-port", "9114"]).healthPort == 9114)
        #expect(throws: (any Error).self) { try PeerTLSTests.settings("accounts", ["HEALTH_PORT": "x"]) }
        // The shared HEALTH_PORT is the services': the gateway (no health-only listener) ignores it,
        // and only its own name reaches it (which GatewayCommand refuses).
        func gateway(_ env: [String: String]) throws -> ServiceSettings {
            try ServiceSettings(
                name: "gateway", options: try ServiceOptions.parse([]), environment: env.merging(["ALLOW_DEV_CREDENTIALS": "1"]) { a, _ in a },
                credentials: .gateway)
        }
        #expect(try gateway(["HEALTH_PORT": "9113"]).healthPort == nil)
        #expect(try gateway(["GATEWAY_HEALTH_PORT": "9115"]).healthPort == 9115)
        #expect(throws: (any Error).self) { try PeerTLSTests.settings("accounts", [:], ["--port", "9101", "--health-port", "9101"]) }
    }

    @Test func aHealthPortAnswersHealthOnlyOverH2CAndTheMainPortKeepsMutualTLSAndCredentials() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let settings = try PeerTLSTests.settings(
            "accounts", ["SERVICE_TOKEN": TestCredentials.serviceToken, "GATEWAY_TOKEN": TestCredentials.gatewayToken],
            certs.serverArguments("accounts", mutual: true) + ["--host", "127.0.0.1", "--port", "0", "--health-port", "0"])
        var logger = Logger(label: "health-port-test")
        logger.logLevel = .warning
        let service = try ServiceHost.serverService(
            settings: settings, services: [AuthTests.Probe()], descriptors: ContractsDescriptors.descriptorSet, keys: TestTokens().source,
            logger: logger)
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: [.init(service: service)], logger: logger))
        let running = Task { try await group.run() }
        var ports: (main: Int, health: Int?)?
        for _ in 0..<200 where ports == nil {
            ports = service.bound.ports.withLock { $0 }
            if ports == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        let (mainPort, healthPortOrNil) = try #require(ports)
        let healthPort = try #require(healthPortOrNil)
        #expect(healthPort != mainPort)

        // The health port: plain h2c, no certificate, no credential; the main server's statuses.
        let plain = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: healthPort))
        #expect(try await Self.health(plain.client) == .serving)
        #expect(try await Self.health(plain.client, "probe.v1.Probe") == .serving)
        await expectFailure(.notFound) { try await Self.health(plain.client, "no.such.Service") }
        // Watch too, following the same table the main server answers from.
        var request = Grpc_Health_V1_HealthCheckRequest()
        request.service = "probe.v1.Probe"
        // A Watch never ends by itself: the body leaves by throwing (the call is cancelled).
        struct Seen: Error { let statuses: [Grpc_Health_V1_HealthCheckResponse.ServingStatus] }
        do {
            try await Grpc_Health_V1_HealthClient(plain.client).watch(request, options: CallOptions(timeout: .seconds(10))) { r in
                var statuses: [Grpc_Health_V1_HealthCheckResponse.ServingStatus] = []
                for try await m in r.messages {
                    statuses.append(m.status)
                    if statuses.count == 1 { service.health.setStatus(.notServing, for: "probe.v1.Probe") }
                    if statuses.count == 2 { throw Seen(statuses: statuses) }
                }
                throw Seen(statuses: statuses)
            }
        } catch let seen as Seen {
            #expect(seen.statuses == [.serving, .notServing])
        }
        service.health.setStatus(.serving, for: "probe.v1.Probe")
        // Nothing else is served there, whatever the credential.
        let other = await expectFailure(.unimplemented) {
            try await plain.client.unary(
                AuthTests.Probe.open, RawMessage(), as: RawMessage.self,
                options: CallOptions(timeout: .seconds(10), metadata: Metadata([(AuthInterceptor.serviceTokenHeader, TestCredentials.serviceToken)])))
        }
        #expect(other != nil)
        await expectFailure(.unimplemented) {
            // Reflection (open on the main port) is not served there either.
            try await plain.client.unary(
                MethodDescriptor(
                    service: "grpc.reflection.v1.ServerReflection", method: "ServerReflectionInfo", kind: .unary,
                    visibility: .publicAnonymous), RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }

        // The main port as before: plain h2c and TLS without a client certificate are refused;
        // with one, health answers and the policy still wants a credential for the rest.
        let h2c = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: mainPort))
        await expectFailure(.unavailable) { try await Self.health(h2c.client) }
        let noCertificate = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: mainPort, tls: try certs.client(as: nil)))
        await expectFailure(.unavailable) { try await Self.health(noCertificate.client) }
        let mutual = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: mainPort, tls: try certs.client(as: "social")))
        #expect(try await Self.health(mutual.client) == .serving)
        await expectFailure(.permissionDenied) {
            try await mutual.client.unary(AuthTests.Probe.inside, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }
        await expectFailure(.unauthenticated) {
            try await mutual.client.unary(AuthTests.Probe.user, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }
        let inside = try await mutual.client.unary(
            AuthTests.Probe.inside, RawMessage(), as: RawMessage.self,
            options: CallOptions(timeout: .seconds(10), metadata: Metadata([(AuthInterceptor.serviceTokenHeader, TestCredentials.serviceToken)])))
        #expect(String(decoding: inside.message.bytes, as: UTF8.self).contains("service=true"))
        for channel in [plain, h2c, noCertificate, mutual] { await channel.close() }

        // Stopped with the main server.
        await group.triggerGracefulShutdown()
        try await running.value
        let after = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: healthPort))
        await expectFailure(.unavailable) { try await Self.health(after.client) }
        await after.close()
    }

    /// A health port already taken: the service does not start, and the error names that port
    /// (`ListenError`, as for any listener: the bind error alone names no address).
    @Test func aHealthPortInUseFailsTheStartNamingIt() async throws {
        let taken = try await RPCServer(
            configuration: ServerConfiguration(host: "127.0.0.1", port: 0, tls: nil), services: [], logger: Logger(label: "taken")
        ).startedForTest()
        let settings = try PeerTLSTests.settings(
            "accounts", ["SERVICE_TOKEN": TestCredentials.serviceToken, "GATEWAY_TOKEN": TestCredentials.gatewayToken],
            ["--host", "127.0.0.1", "--port", "0", "--health-port", String(taken.port)])
        var logger = Logger(label: "health-port-test")
        logger.logLevel = .warning
        let service = try ServiceHost.serverService(
            settings: settings, services: [AuthTests.Probe()], descriptors: ContractsDescriptors.descriptorSet, keys: TestTokens().source,
            logger: logger)
        await #expect { try await service.run() } throws: { "\($0)".contains("cannot listen on 127.0.0.1:\(taken.port):") }
        await taken.server.shutdownGracefully()
    }
}

extension RPCServer {
    fileprivate func startedForTest() async throws -> (server: RPCServer, port: Int) { (self, try await start()) }
}
