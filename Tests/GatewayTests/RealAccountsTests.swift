import Accounts
import Contracts
import Foundation
import Logging
import RPCCore
import RPCServices
import RPCTransport
import Security
import ServiceKit
import Testing

@testable import Gateway

/// The gateway in front of the real accounts service (in-process, real gRPC on loopback): sign
/// up with Connect JSON, then use the issued token over gRPC; accounts verifies it again and
/// throttles by the address the gateway forwards.
@Suite(.serialized) struct RealAccountsTests {
    @Test func signUpThroughConnectThenProfileThroughGRPC() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gw-accounts-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var configuration = AccountsConfiguration(dataDirectory: directory)
        configuration.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        var logger = Logger(label: "accounts-under-gateway")
        logger.logLevel = .warning
        let core = try AccountsCore(configuration: configuration, logger: logger)
        defer { core.close() }
        var serverConfig = ServerConfiguration(host: "127.0.0.1", port: 0)
        serverConfig.threads = 1
        serverConfig.maxReceiveMessageSize = configuration.maxRequestBytes
        serverConfig.interceptors = [
            AuthInterceptor(
                keys: core.signingKeySource, serviceToken: Fake.serviceToken,
                gatewayToken: Fake.gatewayToken)
        ]
        let (_, services) = StandardServices.make(for: core.services, descriptors: ContractsDescriptors.descriptorSet)
        let server = RPCServer(configuration: serverConfig, services: services, logger: logger)
        let accountsPort = try await server.start()

        var config = GatewayConfiguration(
            upstreams: [.init(name: "accounts", host: "127.0.0.1", port: accountsPort)],
            gatewayToken: Fake.gatewayToken)
        config.threads = 1
        let gateway = try Gateway(configuration: config, logger: logger)
        let port = try await gateway.start()
        let channel = RPCChannel(host: "127.0.0.1", port: port)

        do {
            let name = "gw\(SecureRandom.token(bytes: 4).lowercased().filter { $0.isLetter || $0.isNumber })"
            let signUp = try await curl([
                "--http1.1", "-H", "content-type: application/json", "--data-binary",
                #"{"username":"\#(name)","email":"\#(name)@example.com","password":"correct horse battery staple","display_name":"Grace"}"#,
                "http://127.0.0.1:\(port)/accounts.v1.Accounts/SignUp",
            ])
            #expect(signUp.status == 200, "\(signUp.body)")
            let body = json(signUp.body)
            let session = body["session"] as? [String: Any]
            let token = try #require(session?["accessToken"] as? String)
            #expect((body["user"] as? [String: Any])?["displayName"] as? String == "Grace")
            #expect(session?["accessTokenExpiresAt"] is String, "Timestamps as RFC 3339 strings")

            let profile = try await Accounts_V1_AccountsClient(channel.client).getMyProfile(
                Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: Metadata([("authorization", "Bearer \(token)")])))
            #expect(profile.user.username == name)
            #expect(profile.user.displayName == "Grace")

            // A duplicate: accounts' ALREADY_EXISTS with its BadRequest, as Connect JSON.
            let again = try await curl([
                "--http1.1", "-H", "content-type: application/json", "--data-binary",
                #"{"username":"\#(name)","email":"other-\#(name)@example.com","password":"correct horse battery staple"}"#,
                "http://127.0.0.1:\(port)/accounts.v1.Accounts/SignUp",
            ])
            #expect(again.status == 409, "\(again.body)")
            #expect(json(again.body)["code"] as? String == "already_exists")

            // Internal RPCs stay unreachable even though this upstream serves them.
            do {
                _ = try await channel.client.unary(
                    Accounts_V1_AccountsInternalMethods.listSentMail, Accounts_V1_ListSentMailRequest(),
                    as: Accounts_V1_ListSentMailResponse.self,
                    options: CallOptions(metadata: Metadata([("x-service-token", Fake.serviceToken)])))
                Issue.record("internal RPC reachable")
            } catch let e as RPCError {
                #expect(e.code == .unimplemented)
            }
            let health = try await curl([
                "--http2-prior-knowledge", "-H", "content-type: application/json", "--data", "{}",
                "http://127.0.0.1:\(port)/grpc.health.v1.Health/Check",
            ])
            #expect(health.body == #"{"status":"SERVING"}"#)
        } catch {
            Issue.record(error)
        }
        await channel.close()
        await gateway.shutdown()
        await server.shutdownGracefully()
    }
}
