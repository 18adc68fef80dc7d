import Contracts
import Foundation
import GRPCContracts
import Logging
import Observability
import RPCCore
import RPCTransport
import Testing

@testable import Gateway

/// Issue 19: the gateway's rate-limit rejections and each upstream's health, in the process
/// registry (`GET /metrics`).
@Suite(.serialized) struct GatewayMetricsTests {
    static func value(_ name: String, _ labels: [(String, String)]) -> Double? {
        ProcessMetrics.sample(name, labels: labels, in: ProcessMetrics.exposition())
    }

    static func rejections(_ scope: String) -> Double { value("gateway_rate_limit_rejections_total", [("scope", scope)]) ?? 0 }

    @Test func rateLimitRejectionsAreCountedByScope() async throws {
        let h = try await Harness { c in
            // Slow refills (one call in 100 s): nothing comes back during the test, however slow.
            c.addressRate = 0.01
            c.addressBurst = 2
            c.userRate = 0.01
            c.userBurst = 1
        }
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        func code(_ call: () async throws -> Void) async -> StatusCode {
            do {
                try await call()
                return .ok
            } catch let e as RPCError { return e.code } catch { return .unknown }
        }
        let address = Self.rejections("address"), user = Self.rejections("user")
        // The user's limit first (one call a user), then the address's (two calls in all).
        let profile = { _ = try await accounts.getMyProfile(.init(), options: CallOptions(metadata: h.bearer(h.keys.token(user: "m")))) }
        #expect(await code(profile) == .ok)
        #expect(await code(profile) == .resourceExhausted)
        #expect(Self.rejections("user") == user + 1)
        #expect(Self.rejections("address") == address)
        #expect(await code { _ = try await accounts.logIn(.init()) } == .resourceExhausted)
        #expect(Self.rejections("address") == address + 1)
        #expect(Self.rejections("user") == user + 1)
    }

    @Test func eachUpstreamIsUpWhileItAnswersServing() async throws {
        var logger = Logger(label: "gateway-metrics-test")
        logger.logLevel = .critical
        let live = try await FakeUpstream(services: [Fake.Social(recorder: Recorder())], keys: KeyStore([]))
        // A port nothing listens on: bound once, then closed.
        let gone = try await FakeUpstream(services: [], keys: KeyStore([]))
        await gone.stop()
        let id = UUID().uuidString.prefix(8).lowercased()
        let (liveName, goneName) = ("metrics-live-\(id)", "metrics-gone-\(id)")
        let liveChannel = RPCChannel(host: "127.0.0.1", port: live.port)
        let goneChannel = RPCChannel(host: "127.0.0.1", port: gone.port)
        let health = GatewayHealth(
            upstreams: [
                .init(name: liveName, transport: liveChannel, services: ["social.v1.Social"]),
                .init(name: goneName, transport: goneChannel, services: ["tasks.v1.Tasks"]),
            ], required: [], timeout: .seconds(2), logger: logger)
        func up(_ name: String) -> Double? { Self.value("gateway_upstream_up", [("upstream", name)]) }
        #expect(up(liveName) == 0, "nothing is known to be up before the first poll")
        #expect(up(goneName) == 0)
        await health.poll()
        #expect(up(liveName) == 1)
        #expect(up(goneName) == 0)
        await live.stop()
        await health.poll()
        #expect(up(liveName) == 0)
        #expect(up(goneName) == 0)
        await liveChannel.close()
        await goneChannel.close()
    }
}
