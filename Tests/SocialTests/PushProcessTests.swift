import Contracts
import Foundation
import RPCCore
import RPCTransport
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Testing

/// The real `social-service` with push providers from its environment (PUSH_*), pointed at
/// Tests/PushProviders/fake_providers.py: pushes queued while a provider is down survive kill -9
/// and are sent once after the restart; pushes already sent are not sent again.
@Suite("social-service: pushes across kill -9", .serialized, .enabled(if: FakePushProviders.available))
struct PushProcessTests {
    @Test func queuedPushesSurviveKillNineAndEachIsSentOnce() async throws {
        try await withFakeProviders { fake in
            let accounts = try await AccountsPeer()
            let dir = TemporaryDirectory("social-push-proc")
            defer { dir.remove() }
            let ids =
                try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: fake.directory + "/apns.json"))) as? [String: String]
                ?? [:]
            let environment = [
                "PUSH_APNS_KEY_FILE": fake.directory + "/apns-key.p8", "PUSH_APNS_KEY_ID": ids["key_id"] ?? "",
                "PUSH_APNS_TEAM_ID": ids["team_id"] ?? "", "PUSH_APNS_URL": fake.base, "PUSH_APNS_SANDBOX_URL": fake.base,
                "PUSH_FCM_SERVICE_ACCOUNT_FILE": fake.directory + "/fcm-service-account.json", "PUSH_FCM_URL": fake.base,
                "PUSH_TLS_CA": fake.caFile, "PUSH_ALLOW_PRIVATE_ENDPOINTS": "on",
            ]
            let service = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port, environment: environment)
            defer { service.forceStop() }
            let port = try await service.waitUntilListening()
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            let social = Social_V1_SocialClient(channel.client)
            let internalAPI = Social_V1_SocialInternalClient(
                RPCClient(transport: CredentialedTransport(base: channel, serviceToken: TestCredentials.serviceToken)))
            let anna = try await accounts.user("anna")
            let apnsToken = PushTargetsTests.randomHex(), fcmToken = "fcm:\(PushTargetsTests.randomHex(bytes: 20))"
            for target in [PushTargetsTests.apns(apnsToken), PushTargetsTests.fcm(fcmToken)] {
                var r = Social_V1_RegisterPushTargetRequest()
                r.target = target
                _ = try await social.registerPushTarget(r, options: anna.options)
            }
            func send(_ i: Int) async throws {
                var r = Social_V1_SendNotificationRequest()
                r.eventId = "push-crash:\(i)"
                r.recipientUserIds = [anna.id]
                r.kind = .taskAssigned
                r.title = "Chore \(i)"
                _ = try await internalAPI.sendNotification(r)
            }
            // Five sent while both providers work; then FCM is down and five more wait for it.
            for i in 0..<5 { try await send(i) }
            try await PushDeliveryTests.waitFor("ten pushes") { try await fake.received().count == 10 }
            try await fake.script(["provider": "fcm", "status": 503, "reason": "UNAVAILABLE", "times": -1])
            for i in 5..<10 { try await send(i) }
            try await PushDeliveryTests.waitFor("five more APNs pushes and FCM refusing") {
                let apns = try await fake.received("apns").count, refused = try await fake.scripted("fcm").count
                return apns == 10 && refused >= 1
            }
            service.signal(SIGKILL)
            #expect(await service.waitForExit() != 0)
            await channel.close()

            // FCM is back; the restarted process sends the five that waited, and nothing twice.
            try await fake.reset()
            let restarted = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port, environment: environment)
            defer { restarted.forceStop() }
            _ = try await restarted.waitUntilListening()
            // The provider pause and the row's backoff were in memory / a few seconds: at most ~1 min.
            try await PushDeliveryTests.waitFor("the five waiting FCM pushes", timeout: .seconds(90)) {
                try await fake.received("fcm").count >= 5
            }
            try await Task.sleep(for: .seconds(1))
            let after = try await fake.received()
            let titles = after.compactMap { (($0["payload"] as? [String: Any])?["message"] as? [String: Any])?["notification"] as? [String: Any] }
                .compactMap { $0["title"] as? String }
            #expect(after.count == 5, "after the restart: \(after.map { $0["provider"] ?? "" })")
            #expect(Set(titles) == Set((5..<10).map { "Chore \($0)" }))
            #expect(try await fake.rejected().isEmpty)
            restarted.signal(SIGTERM)
            #expect(await restarted.waitForExit() == 0)
            await accounts.stop()
        }
    }
}
