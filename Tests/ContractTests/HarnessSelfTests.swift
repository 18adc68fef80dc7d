import ContractTesting
import Contracts
import RPCCore
import RPCTransport
import Synchronization
import Testing

/// The harness against a fake accounts.v1.Accounts/SignUp served in-process by RPCServer: it
/// sends the request fixture, ignores the generated fields and reports any other difference.
@Suite struct HarnessSelfTests {
    static let paths = ContractPaths.locate()

    /// What the fake saw.
    final class Recorder: Sendable {
        let state = Mutex<(requests: [Accounts_V1_SignUpRequest], authorization: [String?])>(([], []))
    }

    /// Serves SignUp only, answering with `response` whatever the request.
    struct FakeSignUp: RPCService {
        let response: Accounts_V1_SignUpResponse
        let recorder: Recorder
        var serviceName: String { Accounts_V1_AccountsMethods.serviceName }
        var methods: [ServerMethod] {
            [
                ServerMethod(
                    Accounts_V1_AccountsMethods.signUp,
                    .unary(Accounts_V1_SignUpRequest.self, Accounts_V1_SignUpResponse.self) { [response, recorder] request, context in
                        recorder.state.withLock {
                            $0.requests.append(request)
                            $0.authorization.append(context.requestMetadata["authorization"])
                        }
                        return response
                    })
            ]
        }
    }

    /// A fixture decoded into its generated type through protoc's bytes.
    static func decodeFixture<M: ProtoMessage>(_ file: String, as: M.Type) async throws -> M {
        let fixture = try ContractFixture.load(service: "accounts", fileName: file, paths: paths)
        let bytes = try await Protoc(paths: paths).encode(fixture.messageName, text: fixture.text, files: paths.protoFiles(service: "accounts"))
        return try M(serializedBytes: bytes)
    }

    /// Starts the fake answering `response`, runs `body` with a harness pointed at it.
    static func withFake<R>(
        _ response: Accounts_V1_SignUpResponse, _ body: (ContractHarness, Recorder) async throws -> R
    ) async throws -> R {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        let recorder = Recorder()
        let server = RPCServer(configuration: config, services: [FakeSignUp(response: response, recorder: recorder)])
        let port = try await server.start()
        let harness = ContractHarness(host: "127.0.0.1", port: port, paths: paths)
        do {
            let r = try await body(harness, recorder)
            await harness.close()
            await server.shutdownGracefully()
            return r
        } catch {
            await harness.close()
            await server.shutdownGracefully()
            throw error
        }
    }

    @Test func matchesWhenOnlyGeneratedFieldsDiffer() async throws {
        var response = try await Self.decodeFixture("SignUp.response.txtpb", as: Accounts_V1_SignUpResponse.self)
        // Every field the fixture marks as generated gets another value, as a live service's would.
        response.user.userId = "01JXXXXXXXXXXXXXXXXXXXXXXX"
        response.user.createdAt.seconds += 3600
        response.user.updatedAt.seconds += 3600
        response.session.sessionId = "01JYYYYYYYYYYYYYYYYYYYYYYY"
        response.session.accessToken = "v1.other.token"
        response.session.accessTokenExpiresAt.seconds += 60
        response.session.refreshToken = "another-refresh-token"
        response.session.refreshTokenExpiresAt.seconds += 60
        let expectedRequest = try await Self.decodeFixture("SignUp.request.txtpb", as: Accounts_V1_SignUpRequest.self)

        try await Self.withFake(response) { harness, recorder in
            let result = try await harness.check(service: "accounts", method: "SignUp", bearerToken: "test-token")
            #expect(result.matches, "\(result)")
            #expect(result.method == "/accounts.v1.Accounts/SignUp")
            #expect(result.ignored.contains("session.refresh_token"))
            #expect(result.expected.contains("user.username: \"alice\""))
            #expect(!result.expected.contains { $0.hasPrefix("user.user_id") })
            let seen = recorder.state.withLock { $0 }
            #expect(seen.requests == [expectedRequest], "the fake received the request fixture")
            #expect(seen.authorization == ["Bearer test-token"])
        }
    }

    @Test func reportsADifferenceInANonGeneratedField() async throws {
        var response = try await Self.decodeFixture("SignUp.response.txtpb", as: Accounts_V1_SignUpResponse.self)
        response.user.displayName = "Mallory"
        response.user.contactInfo.publicEmail = ""
        response.user.userId = "01JXXXXXXXXXXXXXXXXXXXXXXX"  // generated: still ignored

        try await Self.withFake(response) { harness, _ in
            let result = try await harness.check(service: "accounts", method: "SignUp")
            #expect(!result.matches)
            #expect(
                result.differences == [
                    "- user.display_name: \"Alice Martin\"",
                    "+ user.display_name: \"Mallory\"",
                    "- user.contact_info.public_email: \"alice@studio.example\"",
                ], "\(result)")
            #expect(result.description.contains("differs from accounts/SignUp.response.txtpb"))
        }
    }

    @Test func aMissingMessageFieldIsADifference() async throws {
        var response = try await Self.decodeFixture("SignUp.response.txtpb", as: Accounts_V1_SignUpResponse.self)
        response.clearSession()
        try await Self.withFake(response) { harness, _ in
            let result = try await harness.check(service: "accounts", method: "SignUp")
            // Every session field is generated, but the session itself must be there.
            #expect(result.differences == ["- session {}"], "\(result)")
        }
    }

    @Test func aStatusErrorIsThrown() async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        let server = RPCServer(configuration: config, services: [])
        let port = try await server.start()
        let harness = ContractHarness(host: "127.0.0.1", port: port, paths: Self.paths)
        await #expect(throws: RPCError.self) {
            _ = try await harness.check(service: "accounts", method: "SignUp")
        }
        await harness.close()
        await server.shutdownGracefully()
    }

    /// Serves social.v1.Social/SubscribeNotifications like a live subscription: `started` first,
    /// then `elements`, then nothing until cancelled.
    struct FakeSubscription: RPCService {
        let elements: [Social_V1_SubscribeNotificationsResponse]
        var serviceName: String { Social_V1_SocialMethods.serviceName }
        var methods: [ServerMethod] {
            [
                ServerMethod(
                    Social_V1_SocialMethods.subscribeNotifications,
                    .serverStreaming(Social_V1_SubscribeNotificationsRequest.self, Social_V1_SubscribeNotificationsResponse.self) {
                        [elements] _, writer, _ in
                        var started = Social_V1_SubscribeNotificationsResponse()
                        started.started = Social_V1_SubscriptionStarted()
                        try await writer.write(started)
                        for e in elements { try await writer.write(e) }
                        try await Task.sleep(for: .seconds(60))
                    })
            ]
        }
    }

    @Test func findsTheFixtureElementInALiveStream() async throws {
        let fixture = try ContractFixture.load(service: "social", fileName: "SubscribeNotifications.response.txtpb", paths: Self.paths)
        let bytes = try await Protoc(paths: Self.paths).encode(
            fixture.messageName, text: fixture.text, files: Self.paths.protoFiles(service: "social"))
        var element = try Social_V1_SubscribeNotificationsResponse(serializedBytes: bytes)
        element.notification.notificationId = "01JZZZZZZZZZZZZZZZZZZZZZZZ"  // generated
        var other = element
        other.notification.title = "Someone else"

        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        let server = RPCServer(configuration: config, services: [FakeSubscription(elements: [other, element])])
        let port = try await server.start()
        let harness = ContractHarness(host: "127.0.0.1", port: port, paths: Self.paths)
        let start = ContinuousClock.now
        let found = try await harness.check(service: "social", method: "SubscribeNotifications", timeout: .seconds(30))
        #expect(found.matches, "\(found)")
        // The harness cancels the subscription once it matched instead of waiting for its end.
        #expect(ContinuousClock.now - start < .seconds(20))

        // Only non-matching elements before a quiet stream: the closest one is reported.
        let quiet = try await harness.check(service: "social", method: "SubscribeNotifications", timeout: .seconds(30), maxStreamMessages: 2)
        #expect(!quiet.matches)
        #expect(quiet.differences == ["- notification.title: \"Alice needs help\"", "+ notification.title: \"Someone else\""], "\(quiet)")
        await harness.close()
        await server.shutdownGracefully()
    }
}
