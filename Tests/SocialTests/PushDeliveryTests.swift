import Contracts
import Foundation
import Push
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Testing

/// Pushes through the real providers' protocols (issue 36): social with APNs, FCM and Web Push
/// pointed at Tests/PushProviders/fake_providers.py, which verifies every request (provider
/// token, OAuth exchange and bearer, VAPID, RFC 8291 decryption) as the provider documents it.
@Suite("Social: push delivery", .serialized, .enabled(if: FakePushProviders.available))
struct PushDeliveryTests {
    typealias T = PushTargetsTests

    /// Polls `condition` every 100 ms for up to `timeout`.
    static func waitFor(_ what: String, timeout: Duration = .seconds(15), _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        if try await condition() { return }
        Issue.record("timed out waiting for: \(what)")
        throw FakePushProviders.FakeError("timed out waiting for: \(what)")
    }

    static func outboxCount(_ env: SocialEnv) async throws -> Int {
        try await env.core.database.read { c in try c.queryOne("SELECT count(*) FROM push_outbox")!.get(0, as: Int.self) }
    }

    /// Registers one target of each provider for `user`: (APNs token, FCM token, Web Push subscription id).
    static func registerAll(_ env: SocialEnv, _ fake: FakePushProviders, _ user: User) async throws -> (apns: String, fcm: String, webPush: String) {
        let apns = T.randomHex()
        let fcm = "fcm:\(T.randomHex(bytes: 20))"
        let sub = try await fake.subscription()
        _ = try await T.register(env, T.apns(apns), by: user)
        _ = try await T.register(env, T.fcm(fcm), by: user)
        _ = try await T.register(env, T.webPush(sub.endpoint, p256dh: sub.p256dh, auth: sub.auth), by: user)
        return (apns, fcm, sub.id)
    }

    @Test func everyProviderGetsOneVerifiedPushWithCollapseKeyAndBadge() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings()
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let alice = try await env.user("alice")
                let tokens = try await Self.registerAll(env, fake, alice)
                let sent = try await env.notify([alice.id], kind: .taskReminder, title: "Take out the recycling", event: "tasks:push-1")
                let id = sent.notificationIds[alice.id] ?? ""
                try await Self.waitFor("three pushes") { try await fake.received().count >= 3 }
                let received = try await fake.received()
                #expect(received.count == 3)
                #expect(try await fake.rejected().isEmpty)

                let apns = try #require(received.first { $0["provider"] as? String == "apns" })
                #expect(apns["token"] as? String == tokens.apns)
                #expect(apns["http_version"] as? String == "2")
                let h = apns["headers"] as? [String: String] ?? [:]
                #expect(h["apns-topic"] == "com.example.chores")
                #expect(h["apns-push-type"] == "alert")
                #expect(h["apns-collapse-id"] == id)
                #expect(Int64(h["apns-expiration"] ?? "") ?? 0 > Int64(Date().timeIntervalSince1970) + 23 * 3600)
                let aps = (apns["payload"] as? [String: Any])?["aps"] as? [String: Any]
                #expect((aps?["alert"] as? [String: Any])?["title"] as? String == "Take out the recycling")
                #expect(aps?["badge"] as? Int == 1)
                #expect((apns["payload"] as? [String: Any])?["notification_id"] as? String == id)
                #expect((apns["payload"] as? [String: Any])?["kind"] as? String == "TASK_REMINDER")

                let fcm = try #require(received.first { $0["provider"] as? String == "fcm" })
                #expect(fcm["token"] as? String == tokens.fcm)
                let message = (fcm["payload"] as? [String: Any])?["message"] as? [String: Any] ?? [:]
                #expect((message["notification"] as? [String: Any])?["title"] as? String == "Take out the recycling")
                #expect((message["data"] as? [String: Any])?["notification_id"] as? String == id)
                let android = message["android"] as? [String: Any] ?? [:]
                #expect((android["notification"] as? [String: Any])?["tag"] as? String == id)
                #expect(try await fake.stats()["fcm_tokens_issued"] as? Int == 1)

                let web = try #require(received.first { $0["provider"] as? String == "webpush" })
                #expect(web["token"] as? String == tokens.webPush)
                let wh = web["headers"] as? [String: String] ?? [:]
                #expect(wh["topic"] == id)
                #expect(wh["urgency"] == "high")
                #expect(Int(wh["ttl"] ?? "") ?? 0 > 23 * 3600)
                let plain = web["payload"] as? [String: Any] ?? [:]
                #expect(plain["title"] as? String == "Take out the recycling")
                #expect(plain["notification_id"] as? String == id)
                #expect(plain["badge"] as? Int == 1)

                // Sent once: the rows are gone, a redelivered event pushes nothing, nothing more arrives.
                try await Self.waitFor("the push outbox emptied") { try await Self.outboxCount(env) == 0 }
                _ = try await env.notify([alice.id], kind: .taskReminder, title: "Take out the recycling", event: "tasks:push-1")
                try await Task.sleep(for: .milliseconds(700))
                #expect(try await fake.received().count == 3)

                // A second notification: the badge counts both unread.
                _ = try await env.notify([alice.id], kind: .taskAssigned, title: "Dishes", event: "tasks:push-2")
                try await Self.waitFor("three more pushes") { try await fake.received().count >= 6 }
                let second = try await fake.received().dropFirst(3)
                let apns2 = try #require(second.first { $0["provider"] as? String == "apns" })
                #expect(((apns2["payload"] as? [String: Any])?["aps"] as? [String: Any])?["badge"] as? Int == 2)
                #expect(try await fake.stats()["fcm_tokens_issued"] as? Int == 1)  // the access token is kept
                #expect(try await fake.rejected().isEmpty)
            }
        }
    }

    @Test func targetsTheProviderSaysAreGoneAreRemoved() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings()
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let bob = try await env.user("bob")
                let tokens = try await Self.registerAll(env, fake, bob)
                let kept = T.randomHex()
                _ = try await T.register(env, T.apns(kept), by: bob)
                try await fake.script(["provider": "apns", "token": tokens.apns, "status": 410, "reason": "Unregistered", "times": 1])
                try await fake.script(["provider": "fcm", "token": tokens.fcm, "reason": "UNREGISTERED", "times": 1])
                try await fake.deleteSubscription(tokens.webPush)  // the browser unsubscribed: 410 Gone
                _ = try await env.notify([bob.id], title: "Water the plants")
                try await Self.waitFor("only the healthy target left") { try await T.list(env, bob).count == 1 }
                #expect(try await T.list(env, bob).first?.apns.deviceToken == kept)
                try await Self.waitFor("the push outbox emptied") { try await Self.outboxCount(env) == 0 }
                let received = try await fake.received()
                #expect(received.count == 1)
                #expect(received.first?["token"] as? String == kept)
                #expect(try await fake.scripted().count == 2)
            }
        }
    }

    @Test func retryAfterIsHonouredAndTheDeviceBacksOffAlone() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings()
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let carol = try await env.user("carol")
                let tokens = try await Self.registerAll(env, fake, carol)
                try await fake.script(["provider": "webpush", "token": tokens.webPush, "status": 429, "retry_after": 120, "times": 1])
                _ = try await env.notify([carol.id], title: "Vacuum")
                // APNs and FCM go at once; Web Push was told to come back in 120 s.
                try await Self.waitFor("two pushes and one 429") {
                    let sent = try await fake.received().count, scripted = try await fake.scripted("webpush").count
                    return sent == 2 && scripted == 1
                }
                let row = try await env.core.database.read { c in
                    try c.queryOne("SELECT due_at, attempts, last_error FROM push_outbox")
                }
                let due = try #require(row).get("due_at", as: Int64.self)
                #expect(due >= env.clock.nowMilliseconds() + 119_000 && due <= env.clock.nowMilliseconds() + 121_000)
                #expect(try row?.get("attempts", as: Int.self) == 1)
                try await Task.sleep(for: .milliseconds(500))
                #expect(try await fake.received("webpush").isEmpty)
                env.clock.advance(by: .seconds(121))
                env.core.wakePush()
                try await Self.waitFor("the web push after its Retry-After") { try await fake.received("webpush").count == 1 }
                #expect(try await fake.rejected().isEmpty)
            }
        }
    }

    @Test func aProviderThatHangsOrFailsSlowsNoOther() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings(timeout: .seconds(1))
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let dave = try await env.user("dave")
                _ = try await Self.registerAll(env, fake, dave)
                try await fake.script(["provider": "apns", "delay_ms": 5000])  // hangs past our 1 s timeout
                try await fake.script(["provider": "fcm", "status": 503, "reason": "UNAVAILABLE", "times": -1])
                let start = ContinuousClock.now
                _ = try await env.notify([dave.id], title: "Laundry")
                try await Self.waitFor("the web push") { try await fake.received("webpush").count == 1 }
                #expect(ContinuousClock.now - start < .seconds(3))
                // APNs timed out and FCM failed: both wait, paused as providers.
                try await Self.waitFor("APNs and FCM waiting") {
                    let rows = try await env.core.database.read { c in
                        try c.query("SELECT provider, attempts FROM push_outbox ORDER BY provider").map {
                            (try $0.get(0, as: Int.self), try $0.get(1, as: Int.self))
                        }
                    }
                    return rows.map(\.0) == [1, 2] && rows.allSatisfy { $0.1 >= 1 }
                }
                try await fake.reset()
                env.clock.advance(by: .seconds(3700))
                env.core.wakePush()
                try await Self.waitFor("APNs and FCM after they recovered", timeout: .seconds(20)) {
                    let apns = try await fake.received("apns").count, fcm = try await fake.received("fcm").count
                    return apns == 1 && fcm == 1
                }
                try await Self.waitFor("the push outbox emptied") { try await Self.outboxCount(env) == 0 }
            }
        }
    }

    static func setPreferences(
        _ env: SocialEnv, _ user: User, disabled: [Social_V1_NotificationKind] = [], quiet: (Int32, Int32, String)? = nil
    )
        async throws -> Social_V1_NotificationSettings
    {
        var r = Social_V1_SetPushPreferencesRequest()
        r.preferences.disabledKinds = disabled
        if let (start, end, zone) = quiet {
            r.preferences.quietHours.startMinute = start
            r.preferences.quietHours.endMinute = end
            r.preferences.quietHours.timeZone = zone
        }
        return try await env.social.setPushPreferences(r, options: user.options).settings
    }

    @Test func preferencesTurnKindsOffAndQuietHoursDelayOrDrop() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings(apns: true, fcm: false, webPush: false)
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let erin = try await env.user("erin")
                _ = try await T.register(env, T.apns(), by: erin)

                // Validation: every bad field named, nothing changed.
                var bad = Social_V1_SetPushPreferencesRequest()
                bad.preferences.disabledKinds = [.unspecified, .newBid, .newBid]
                bad.preferences.quietHours.startMinute = 1440
                bad.preferences.quietHours.endMinute = 60
                bad.preferences.quietHours.timeZone = "CEST"
                let error = await #expect(throws: RPCError.self) { try await env.social.setPushPreferences(bad, options: erin.options) }
                #expect(error?.code == .invalidArgument)
                for field in [
                    "preferences.disabled_kinds[0]", "preferences.disabled_kinds[2]", "preferences.quiet_hours.start_minute",
                    "preferences.quiet_hours.time_zone",
                ] {
                    #expect(error?.message.contains(field) == true, "\(field) in \(error?.message ?? "")")
                }

                let s = try await Self.setPreferences(env, erin, disabled: [.taskComment])
                #expect(s.push.disabledKinds == [.taskComment])
                var get = try await env.social.getNotificationSettings(Social_V1_GetNotificationSettingsRequest(), options: erin.options)
                #expect(get.settings.push.disabledKinds == [.taskComment])
                _ = try await env.notify([erin.id], kind: .taskComment, title: "A comment")
                _ = try await env.notify([erin.id], kind: .taskAssigned, title: "Assigned")
                try await Self.waitFor("the assigned push") { try await fake.received().count == 1 }
                #expect(try await Self.outboxCount(env) == 0)

                // Quiet hours around now (UTC): a delayable kind waits, a short-lived one is dropped.
                let minute = Int32((env.clock.nowMilliseconds() / 60_000) % 1440)
                let start = (minute + 1440 - 30) % 1440, end = (minute + 60) % 1440
                let q = try await Self.setPreferences(env, erin, quiet: (start, end, "UTC"))
                #expect(q.push.quietHours.timeZone == "UTC")
                #expect(q.push.disabledKinds.isEmpty)
                let later = try await env.notify([erin.id], kind: .bidAccepted, title: "Your bid was accepted")
                _ = try await env.notify([erin.id], kind: .matchFound, title: "Opponent found")
                let read = try await env.notify([erin.id], kind: .newBid, title: "A new bid")
                #expect(try await Self.outboxCount(env) == 2)  // matchFound not queued
                // Read before its push left: not pushed.
                var mark = Social_V1_MarkNotificationsReadRequest()
                mark.notificationIds = Array(read.notificationIds.values)
                _ = try await env.social.markNotificationsRead(mark, options: erin.options)
                try await Task.sleep(for: .milliseconds(500))
                #expect(try await fake.received().count == 1)
                env.clock.advance(by: .seconds(61 * 60))
                env.core.wakePush()
                try await Self.waitFor("the push delayed past quiet hours") { try await fake.received().count == 2 }
                try await Self.waitFor("the push outbox emptied") { try await Self.outboxCount(env) == 0 }
                let last = try await fake.received().last
                #expect((last?["headers"] as? [String: String])?["apns-collapse-id"] == later.notificationIds[erin.id])

                // Clearing: unset preferences = every kind, no quiet hours.
                _ = try await env.social.setPushPreferences(Social_V1_SetPushPreferencesRequest(), options: erin.options)
                get = try await env.social.getNotificationSettings(Social_V1_GetNotificationSettingsRequest(), options: erin.options)
                #expect(!get.settings.push.hasQuietHours)
            }
        }
    }

    @Test func silencedNotificationsAndStreamingUsersWhenSetAreNotPushed() async throws {
        try await withFakeProviders { fake in
            let settings = try fake.settings(apns: true, fcm: false, webPush: false)
            try await withSocial(
                tasksUp: false,
                {
                    $0.push = settings
                    $0.pushWhileStreaming = false
                }
            ) { env in
                let frank = try await env.user("frank")
                _ = try await T.register(env, T.apns(), by: frank)
                var snooze = Social_V1_SnoozeNotificationsRequest()
                snooze.duration.seconds = 3600
                _ = try await env.social.snoozeNotifications(snooze, options: frank.options)
                _ = try await env.notify([frank.id], title: "Snoozed")
                #expect(try await Self.outboxCount(env) == 0)
                snooze.duration.seconds = 0
                _ = try await env.social.snoozeNotifications(snooze, options: frank.options)

                let stream = try await LiveStream.open(env.social, frank)
                _ = try await env.notify([frank.id], title: "While streaming")
                #expect(try await Self.outboxCount(env) == 0)
                await stream.cancel()
                try await Self.waitFor("the stream gone") { env.core.hub.liveCount(userID: frank.id) == 0 }
                _ = try await env.notify([frank.id], title: "App closed")
                try await Self.waitFor("the push") { try await fake.received().count == 1 }
            }
        }
    }

    @Test func webPushEndpointsOnPrivateAddressesAreRefusedOutsideTests() async throws {
        try await withFakeProviders { fake in
            let settings = try {
                var s = try fake.settings(apns: false, fcm: false, webPush: true)
                s.allowPrivateEndpoints = false
                return s
            }()
            try await withSocial(tasksUp: false, { $0.push = settings }) { env in
                let gina = try await env.user("gina")
                let sub = try await fake.subscription()
                _ = try await T.register(env, T.webPush(sub.endpoint, p256dh: sub.p256dh, auth: sub.auth), by: gina)
                _ = try await env.notify([gina.id], title: "To 127.0.0.1")
                try await Self.waitFor("the target removed") { try await T.list(env, gina).isEmpty }
                #expect(try await fake.received().isEmpty)
                #expect(try await fake.stats()["requests"].flatMap { ($0 as? [String: Any])?["webpush"] as? Int } == 0)
            }
        }
    }
}
