import ArgumentParser
import Contracts
import Foundation
import GRPCContracts
import Observability
import RPCCore
import RPCServices
import RPCTLS
import RPCTransport
import ServiceKit
import Testing

@testable import Gateway

@Suite(.serialized) struct HealthTests {
    /// The per-call checks read `MethodDescriptor.isInfrastructure`; the reflection lists and the
    /// tracing interceptor's `untraced` use `StandardServices.standardNames`: the same services.
    @Test func theInfrastructureServicesAreTheStandardOnes() {
        #expect(Set(MethodDescriptor.infrastructureServices) == Set(StandardServices.standardNames))
        #expect(Set(MethodDescriptor.infrastructureServices) == AuthInterceptor.open)
    }

    static func status(_ h: Harness, _ service: String) async throws -> Grpc_Health_V1_HealthCheckResponse.ServingStatus {
        var req = Grpc_Health_V1_HealthCheckRequest()
        req.service = service
        return try await Grpc_Health_V1_HealthClient(h.client).check(req).status
    }

    @Test func healthAggregatesTheUpstreams() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        #expect(try await Self.status(h, "") == .serving)
        #expect(try await Self.status(h, "accounts.v1.Accounts") == .serving)
        #expect(try await Self.status(h, "social.v1.Social") == .serving)
        await h.social.stop()
        #expect(try await eventually { try await Self.status(h, "") == .notServing })
        #expect(try await Self.status(h, "social.v1.Social") == .notServing)
        #expect(try await Self.status(h, "accounts.v1.Accounts") == .serving, "only the missing upstream's entry changes")
    }

    @Test func overallHealthNeedsOnlyTheRequiredUpstreams() async throws {
        let h = try await Harness { $0.requiredUpstreams = ["accounts"] }
        defer { Task { await h.stop() } }
        await h.social.stop()
        #expect(try await eventually { try await Self.status(h, "social.v1.Social") == .notServing })
        #expect(try await Self.status(h, "") == .serving)
    }

    /// What the probes ask (deploy/kubernetes/gateway.yaml, compose): the process's own name
    /// stays SERVING with an upstream down while "" does not, and turns NOT_SERVING once the
    /// gateway drains (what its SIGTERM handler does: `markAllNotServing`, then GOAWAY).
    @Test func processHealthIgnoresTheUpstreamsButNotDraining() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let process = GatewayHealth.processService
        #expect(try await Self.status(h, process) == .serving)
        await h.social.stop()
        #expect(try await eventually { try await Self.status(h, "") == .notServing })
        #expect(try await Self.status(h, "social.v1.Social") == .notServing)
        #expect(try await Self.status(h, process) == .serving, "one upstream down leaves the process ready")
        h.gateway.health.markAllNotServing()
        #expect(try await Self.status(h, process) == .notServing, "draining takes the process out")
        #expect(try await Self.status(h, "") == .notServing)
    }

    @Test func reflectionListsThePublicServicesOnly() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let names = try await Grpc_Reflection_V1_ServerReflectionClient(h.client).serverReflectionInfo {
            (w: RequestWriter<Grpc_Reflection_V1_ServerReflectionRequest>, r: ClientStreamingResponse<Grpc_Reflection_V1_ServerReflectionResponse>) in
            var req = Grpc_Reflection_V1_ServerReflectionRequest()
            req.messageRequest = .listServices("")
            try await w.write(req)
            try await r.call.closeSend()
            var names: [String] = []
            for try await m in r.messages {
                if case .listServicesResponse(let l)? = m.messageResponse { names += l.service.map(\.name) }
            }
            return names
        }
        #expect(names.contains("accounts.v1.Accounts"))
        #expect(names.contains("social.v1.Social"))
        #expect(names.contains("grpc.health.v1.Health"))
        #expect(!names.contains { $0.hasSuffix("Internal") })
    }

    @Test func tlsWithALPNForGRPCAndHTTP1() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("gw-tls-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (cert, key) = try DevelopmentCertificate.generate(commonName: "localhost", directory: dir)
        let h = try await Harness { c in
            c.tls = try! TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: ["h2", "http/1.1"])
        }
        defer { Task { await h.stop() } }
        for version in ["--http1.1", "--http2"] {
            let r = try await curl([
                version, "--cacert", cert, "-X", "POST", "-H", "content-type: application/json", "--data", "{}",
                "https://localhost:\(h.port)/grpc.health.v1.Health/Check",
            ])
            #expect(r.status == 200, "\(version)")
            #expect(r.body == #"{"status":"SERVING"}"#, "\(version)")
        }
        var config = ChannelConfiguration(host: "127.0.0.1", port: h.port)
        config.tls = try TLSConfiguration.client(alpn: ["h2"], trustRootsPEMFile: cert, serverName: "localhost")
        let channel = RPCChannel(configuration: config)
        var req = Accounts_V1_LogInRequest()
        req.username = "tls"
        let r = try await Accounts_V1_AccountsClient(channel.client).logIn(req)
        #expect(r.user.userId == "u-tls")
        await channel.close()
    }

    @Test func configurationFromTheEnvironment() throws {
        let options = try ServiceOptions.parse([])
        let env = [
            "GATEWAY_PORT": "18080", "ACCOUNTS_ADDR": "10.0.0.5:7000", "TASKS_PORT": "7002", "GATEWAY_TOKEN": "t", "ALLOW_DEV_CREDENTIALS": "1",
            "GATEWAY_UPSTREAMS": "accounts, tasks", "GATEWAY_USER_RATE": "5", "GATEWAY_MAX_DEADLINE_MS": "1500",
            "GATEWAY_KEEPALIVE_TIME_MS": "15000", "GATEWAY_MAX_CONNECTION_AGE_MS": "0", "GATEWAY_TCP_KEEPALIVE_S": "30",
        ]
        let settings = try ServiceSettings(name: "gateway", options: options, environment: env, credentials: .gateway)
        let c = try GatewayConfiguration.from(settings: settings, environment: env)
        #expect(c.port == 18080)
        #expect(c.upstreams.first { $0.name == "accounts" } == .init(name: "accounts", host: "10.0.0.5", port: 7000))
        #expect(c.upstreams.first { $0.name == "tasks" }?.port == 7002)
        #expect(c.upstreams.first { $0.name == "social" }?.port == 9104)
        #expect(c.requiredUpstreams == ["accounts", "tasks"])
        #expect(c.userRate == 5)
        #expect(c.maxDeadline == .milliseconds(1500))
        #expect(c.gatewayToken == "t")
        var server = ServerConfiguration(host: "127.0.0.1", port: 0)
        c.connection?.apply(to: &server)
        c.adjustServer(&server)
        #expect(server.keepaliveTime == .seconds(15))
        #expect(server.maxConnectionAge == nil, "0 turns it off")
        #expect(server.tcpKeepaliveIdle == .seconds(30))
        #expect(server.maxConnectionIdle == .seconds(300), "unset keeps the transport's default")
        #expect(throws: (any Error).self) {
            try GatewayConfiguration.from(settings: settings, environment: ["GATEWAY_UPSTREAMS": "bogus"])
        }
        #expect(throws: (any Error).self) {
            let bad = env.merging(["GATEWAY_MAX_CONNECTION_IDLE_MS": "5 min"]) { _, b in b }
            _ = try GatewayConfiguration.from(
                settings: try ServiceSettings(name: "gateway", options: options, environment: bad, credentials: .gateway), environment: bad)
        }
    }
}

/// Issue 19: the gateway counts the calls it relays, and serves its /metrics only to loopback
/// clients or to a bearer of GATEWAY_METRICS_TOKEN (its port is public).
@Suite(.serialized) struct GatewayCallMetricsTests {
    @Test func relayedCallsAreCountedAndMetricsAreServedToLoopback() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let labels = [("grpc_service", "accounts.v1.Accounts"), ("grpc_method", "GetSigningKeys"), ("grpc_code", "OK")]
        func handled() async throws -> Double {
            let r = try await curl(["--http1.1", "http://127.0.0.1:\(h.port)/metrics"])
            #expect(r.status == 200)
            return ProcessMetrics.sample("grpc_server_handled_total", labels: labels, in: r.body) ?? 0
        }
        let before = try await handled()
        let accounts = Accounts_V1_AccountsClient(h.client)
        for _ in 0..<5 { _ = try await accounts.getSigningKeys(Accounts_V1_GetSigningKeysRequest()) }
        // At least these five (the registry is the process's: other gateways of other tests may
        // relay the same method meanwhile).
        #expect(try await handled() >= before + 5)
        // Over HTTP/2 as well (prior knowledge).
        let h2 = try await curl(["--http2-prior-knowledge", "http://127.0.0.1:\(h.port)/metrics"])
        #expect(h2.status == 200 && h2.body.contains("# TYPE grpc_server_handled_total counter"))
    }

    /// Browser calls end in the gateway's HTTP handler, not in the gRPC transport: they are
    /// counted all the same (an interceptor tells the observers), refusals at their headers too.
    @Test func browserCallsAreCountedAsGRPCCallsAre() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        func handled(_ method: String, _ code: String) async throws -> Double {
            let r = try await curl(["--http1.1", "http://127.0.0.1:\(h.port)/metrics"])
            let labels = [("grpc_service", "accounts.v1.Accounts"), ("grpc_method", method), ("grpc_code", code)]
            return ProcessMetrics.sample("grpc_server_handled_total", labels: labels, in: r.body) ?? 0
        }
        let logIns = try await handled("LogIn", "OK")
        let refused = try await handled("GetMyProfile", "UNAUTHENTICATED")
        let bad = try await handled("LogIn", "INVALID_ARGUMENT")
        for _ in 0..<3 {
            let r = try await ConnectTests.post(h, "/accounts.v1.Accounts/LogIn", #"{"username": "ada", "password": "pw"}"#)
            #expect(r.status == 200)
        }
        // No token on an authenticated method: refused at the headers.
        #expect(try await ConnectTests.post(h, "/accounts.v1.Accounts/GetMyProfile", "{}").status == 401)
        // JSON that is not the message: refused by the decoding, inside the chain.
        #expect(try await ConnectTests.post(h, "/accounts.v1.Accounts/LogIn", #"{"username": 5}"#).status == 400)
        #expect(try await handled("LogIn", "OK") >= logIns + 3)
        #expect(try await handled("GetMyProfile", "UNAUTHENTICATED") >= refused + 1)
        #expect(try await handled("LogIn", "INVALID_ARGUMENT") >= bad + 1)
    }

    @Test func withATokenOnlyItsBearerReadsMetrics() async throws {
        let token = "metrics-token-0123456789"
        let h = try await Harness { $0.metricsToken = token }
        defer { Task { await h.stop() } }
        let url = "http://127.0.0.1:\(h.port)/metrics"
        #expect(try await curl(["--http1.1", url]).status == 404)
        #expect(try await curl(["--http1.1", "-H", "authorization: Bearer wrong-token-0123456789", url]).status == 404)
        let ok = try await curl(["--http1.1", "-H", "authorization: Bearer \(token)", url])
        #expect(ok.status == 200 && ok.body.contains("grpc_server_handled_total"))
    }

    @Test func aShortOrSpacedTokenRefusesTheStart() throws {
        let options = try ServiceOptions.parse([])
        let settings = try ServiceSettings(
            name: "gateway", options: options,
            environment: ["GATEWAY_TOKEN": String(repeating: "g", count: 40), "GATEWAY_METRICS_TOKEN": "short"], credentials: .gateway)
        #expect(throws: (any Error).self) { try GatewayConfiguration.from(settings: settings) }
    }
}
