import Accounts
import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import ServiceKitTesting
import Social
import Testing

/// Push targets (issue 36, step 1: the device registry): RegisterPushTarget, ListPushTargets and
/// RemovePushTarget through the real service on loopback, and EraseUser removing them.
@Suite("Social: push targets", .serialized)
struct PushTargetsTests {
    /// RFC 8291 §5's example subscription keys (a real P-256 point and a 16-byte secret).
    static let rfcP256dh = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
    static let rfcAuth = "BTBZMqHH6r4Tts7J_aSIgg"
    /// P-256's base point G, uncompressed (another valid public key).
    static let generator: [UInt8] = hexBytes(
        "046B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C2964FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5")

    static func hexBytes(_ s: String) -> [UInt8] {
        var out: [UInt8] = []
        var i = s.startIndex
        while i < s.endIndex {
            let j = s.index(i, offsetBy: 2)
            out.append(UInt8(s[i..<j], radix: 16)!)
            i = j
        }
        return out
    }
    static func randomHex(bytes: Int = 32) -> String { SecureRandom.bytes(bytes).map { String(format: "%02x", $0) }.joined() }

    static func apns(
        _ token: String = PushTargetsTests.randomHex(), topic: String = "com.example.chores", environment: Social_V1_ApnsEnvironment = .production,
        label: String = ""
    ) -> Social_V1_PushTarget {
        var t = Social_V1_PushTarget()
        t.apns.deviceToken = token
        t.apns.topic = topic
        t.apns.environment = environment
        t.label = label
        return t
    }
    static func fcm(_ token: String = "fcm:\(PushTargetsTests.randomHex(bytes: 40))", label: String = "") -> Social_V1_PushTarget {
        var t = Social_V1_PushTarget()
        t.fcm.registrationToken = token
        t.label = label
        return t
    }
    static func webPush(
        _ endpoint: String = "https://push.example.net/wpush/v2/\(PushTargetsTests.randomHex())", p256dh: String = rfcP256dh, auth: String = rfcAuth,
        label: String = ""
    ) -> Social_V1_PushTarget {
        var t = Social_V1_PushTarget()
        t.webPush.endpoint = endpoint
        t.webPush.p256dh = p256dh
        t.webPush.auth = auth
        t.label = label
        return t
    }

    static func register(_ env: SocialEnv, _ target: Social_V1_PushTarget, by user: User) async throws -> Social_V1_RegisterPushTargetResponse {
        var r = Social_V1_RegisterPushTargetRequest()
        r.target = target
        return try await env.social.registerPushTarget(r, options: user.options)
    }
    static func list(_ env: SocialEnv, _ user: User) async throws -> [Social_V1_PushTarget] {
        try await env.social.listPushTargets(Social_V1_ListPushTargetsRequest(), options: user.options).targets
    }
    static func remove(_ env: SocialEnv, _ id: String, by user: User) async throws -> Social_V1_RemovePushTargetResponse {
        var r = Social_V1_RemovePushTargetRequest()
        r.targetId = id
        return try await env.social.removePushTarget(r, options: user.options)
    }

    @Test func eachKindRegistersNormalisedListsNewestFirstAndReRegistersInPlace() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice")
            #expect(try await Self.list(env, alice).isEmpty)

            let token = Self.randomHex()
            let phone = try await Self.register(env, Self.apns(token.uppercased(), label: "  Anna's iPhone "), by: alice)
            #expect(phone.evictedTargetIds.isEmpty)
            #expect(ULID.isValid(phone.target.targetId))
            #expect(phone.target.apns.deviceToken == token)  // lower case
            #expect(phone.target.apns.topic == "com.example.chores" && phone.target.apns.environment == .production)
            #expect(phone.target.label == "Anna's iPhone")
            #expect(phone.target.createdAt == env.clock.nowTimestamp() && phone.target.updatedAt == phone.target.createdAt)

            env.clock.advance(by: .seconds(1))
            let fcmToken = "cXl0b2tlbg:APA91b\(Self.randomHex(bytes: 60))_-"
            let pixel = try await Self.register(env, Self.fcm(fcmToken, label: "Pixel"), by: alice)
            #expect(pixel.target.fcm.registrationToken == fcmToken && pixel.target.label == "Pixel")

            env.clock.advance(by: .seconds(1))
            // Padding accepted and dropped; scheme and host lower-cased, the path kept as sent.
            let browser = try await Self.register(
                env, Self.webPush("HTTPS://Push.Example.NET:8443/Sub/AbC?x=%2F", p256dh: Self.rfcP256dh + "=", auth: Self.rfcAuth + "=="),
                by: alice)
            #expect(browser.target.webPush.endpoint == "https://push.example.net:8443/Sub/AbC?x=%2F")
            #expect(browser.target.webPush.p256dh == Self.rfcP256dh && browser.target.webPush.auth == Self.rfcAuth)
            #expect(browser.target.label.isEmpty)

            var listed = try await Self.list(env, alice)
            #expect(listed.map(\.targetId) == [browser.target.targetId, pixel.target.targetId, phone.target.targetId])
            #expect(listed == [browser.target, pixel.target, phone.target])

            // Re-registering the same token (any case) updates it in place: same id and created_at.
            env.clock.advance(by: .seconds(1))
            let again = try await Self.register(
                env, Self.apns(token, topic: "com.example.chores.beta", environment: .sandbox, label: "Work phone"), by: alice)
            #expect(again.target.targetId == phone.target.targetId && again.evictedTargetIds.isEmpty)
            #expect(again.target.apns.topic == "com.example.chores.beta" && again.target.apns.environment == .sandbox)
            #expect(again.target.label == "Work phone")
            #expect(again.target.createdAt == phone.target.createdAt && again.target.updatedAt == env.clock.nowTimestamp())
            // The same endpoint (host in another case) with new keys: the same target, new keys.
            env.clock.advance(by: .seconds(1))
            let newKey = Base64URL.encode(Self.generator)
            let rekeyed = try await Self.register(
                env,
                Self.webPush("https://PUSH.example.net:8443/Sub/AbC?x=%2F", p256dh: newKey, auth: Base64URL.encode([UInt8](repeating: 7, count: 16))),
                by: alice)
            #expect(rekeyed.target.targetId == browser.target.targetId && rekeyed.target.webPush.p256dh == newKey)

            listed = try await Self.list(env, alice)
            #expect(listed.map(\.targetId) == [browser.target.targetId, phone.target.targetId, pixel.target.targetId])
            #expect(listed.first == rekeyed.target && listed[1] == again.target)
        }
    }

    @Test func aTokenRegisteredByAnotherUserMovesToThem() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            for target in [Self.apns(), Self.fcm(), Self.webPush()] {
                let mine = try await Self.register(env, target, by: alice)
                env.clock.advance(by: .seconds(1))
                let moved = try await Self.register(env, target, by: bob)
                #expect(moved.target.targetId != mine.target.targetId)
                #expect(try await Self.list(env, alice).isEmpty)
                #expect(try await Self.list(env, bob).map(\.targetId) == [moved.target.targetId])
                // alice's old id is gone for both of them.
                await expectFailure(.notFound, fields: ["target_id"]) { try await Self.remove(env, mine.target.targetId, by: alice) }
                await expectFailure(.notFound, fields: ["target_id"]) { try await Self.remove(env, mine.target.targetId, by: bob) }
                // And back to alice when she signs in on the device again.
                env.clock.advance(by: .seconds(1))
                let back = try await Self.register(env, target, by: alice)
                #expect(try await Self.list(env, bob).isEmpty)
                #expect(try await Self.list(env, alice).map(\.targetId) == [back.target.targetId])
                _ = try await Self.remove(env, back.target.targetId, by: alice)
            }
            // The same token string under two kinds is two registrations.
            let token = Self.randomHex()
            _ = try await Self.register(env, Self.apns(token), by: alice)
            _ = try await Self.register(env, Self.fcm(token), by: bob)
            #expect(try await Self.list(env, alice).count == 1)
            #expect(try await Self.list(env, bob).count == 1)
        }
    }

    @Test func removingAnotherUsersTargetIsNotFoundLikeAnUnknownOne() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice"), mallory = try await env.user("mallory")
            let phone = try await Self.register(env, Self.apns(), by: alice)
            let theirs = await expectFailure(.notFound, fields: ["target_id"]) { try await Self.remove(env, phone.target.targetId, by: mallory) }
            let unknown = await expectFailure(.notFound, fields: ["target_id"]) { try await Self.remove(env, ULID.make(), by: mallory) }
            #expect(theirs?.message == unknown?.message)  // nothing tells the two apart
            #expect(try await Self.list(env, alice).map(\.targetId) == [phone.target.targetId])
            await expectFailure(.invalidArgument, fields: ["target_id"]) { try await Self.remove(env, "", by: alice) }
            await expectFailure(.invalidArgument, fields: ["target_id"]) { try await Self.remove(env, String(repeating: "A", count: 65), by: alice) }
            _ = try await Self.remove(env, phone.target.targetId, by: alice)
            #expect(try await Self.list(env, alice).isEmpty)
            await expectFailure(.notFound, fields: ["target_id"]) { try await Self.remove(env, phone.target.targetId, by: alice) }
        }
    }

    @Test func theEleventhTargetEvictsTheLeastRecentlyRegistered() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let bobs = try await Self.register(env, Self.fcm(), by: bob)
            var targets: [Social_V1_PushTarget] = []
            for i in 0..<10 {
                env.clock.advance(by: .seconds(1))
                let r = try await Self.register(env, i % 2 == 0 ? Self.fcm() : Self.apns(), by: alice)
                #expect(r.evictedTargetIds.isEmpty)
                targets.append(r.target)
            }
            // The oldest re-registers (the app started again): it is the newest now.
            env.clock.advance(by: .seconds(1))
            var refresh = Social_V1_PushTarget()
            refresh.fcm = targets[0].fcm
            #expect(try await Self.register(env, refresh, by: alice).evictedTargetIds.isEmpty)
            // The eleventh removes the least recently registered: targets[1].
            env.clock.advance(by: .seconds(1))
            let eleventh = try await Self.register(env, Self.webPush(), by: alice)
            #expect(eleventh.evictedTargetIds == [targets[1].targetId])
            let listed = try await Self.list(env, alice).map(\.targetId)
            #expect(listed.count == 10)
            #expect(listed.first == eleventh.target.targetId && listed[1] == targets[0].targetId)
            #expect(!listed.contains(targets[1].targetId))
            // Another user's targets neither count nor get evicted.
            #expect(try await Self.list(env, bob).map(\.targetId) == [bobs.target.targetId])
        }
    }

    @Test func everyBadFieldIsNamedByItsPath() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice")
            func bad(_ target: Social_V1_PushTarget?, _ fields: [String], sourceLocation: SourceLocation = #_sourceLocation) async {
                var r = Social_V1_RegisterPushTargetRequest()
                if let target { r.target = target }
                await expectFailure(.invalidArgument, fields: fields, sourceLocation: sourceLocation) {
                    try await env.social.registerPushTarget(r, options: alice.options)
                }
            }
            // No target, or one without a destination.
            await bad(nil, ["target"])
            var labelOnly = Social_V1_PushTarget()
            labelOnly.label = "phone"
            await bad(labelOnly, ["target"])

            // APNs.
            let t = "target.apns.device_token"
            for token in [
                "", "xyz0", "g" + String(Self.randomHex().dropFirst()), String(repeating: "a", count: 62), String(repeating: "a", count: 202),
                String(repeating: "a", count: 65), " " + Self.randomHex(), Self.randomHex() + "\n", "ａ" + String(repeating: "a", count: 63),
            ] {
                await bad(Self.apns(token), [t])
            }
            for topic in [
                "", "com..example", ".com.example", "com.example.", "com.example/app", "com example", "cöm.example",
                String(repeating: "a", count: 256),
            ] {
                await bad(Self.apns(topic: topic), ["target.apns.topic"])
            }
            await bad(Self.apns(environment: .unspecified), ["target.apns.environment"])
            await bad(Self.apns(environment: Social_V1_ApnsEnvironment(rawValue: 7)), ["target.apns.environment"])
            await bad(Self.apns("zz", topic: "", environment: .unspecified), [t, "target.apns.topic", "target.apns.environment"])

            // Labels.
            await bad(Self.apns(label: String(repeating: "x", count: 65)), ["target.label"])
            await bad(Self.fcm(label: "bad\u{7}label"), ["target.label"])

            // FCM.
            for token in ["", String(repeating: "x", count: 4097), "two words", "tab\there", "é-token", "line\n"] {
                await bad(Self.fcm(token), ["target.fcm.registration_token"])
            }

            // Web Push.
            let e = "target.web_push.endpoint"
            for endpoint in [
                "", "http://push.example.net/x", "push.example.net/x", "wss://push.example.net/x", "https://", "https:///x", "https://:443/x",
                "https://user@push.example.net/x", "https://push.example.net/x#frag", "https://push.example.net/a b", "https://push.example.net/é",
                "https://push.example.net:0/x", "https://push.example.net:65536/x", "https://push.example.net:/x", "https://push.example.net:44a/x",
                "https://push_example.net/x", "https://push..example.net/x", "https://push.example.net/%zz", "https://push.example.net/%4",
                "https://[fe80::1/x", "https://[]/x", "https://push.example.net/<x>",
                "https://push.example.net/" + String(repeating: "a", count: 2048 - 25 + 1),
            ] {
                await bad(Self.webPush(endpoint), [e])
            }
            let p = "target.web_push.p256dh"
            var offCurve = Self.generator
            offCurve[64] ^= 1
            var xOutsideTheField = [UInt8](repeating: 0xFF, count: 65)
            xOutsideTheField[0] = 0x04
            var compressed = Array(Self.generator.prefix(33))
            compressed[0] = 0x02
            var notUncompressed = Self.generator
            notUncompressed[0] = 0x06
            for key in [
                "", "not base64!", Self.rfcP256dh.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/"),
                Self.rfcP256dh + "===", Base64URL.encode(Self.generator.prefix(64)), Base64URL.encode(Self.generator + [0]),
                Base64URL.encode(compressed), Base64URL.encode(notUncompressed), Base64URL.encode(offCurve),
                Base64URL.encode(xOutsideTheField), Base64URL.encode([0x04] + [UInt8](repeating: 0, count: 64)),
            ] {
                await bad(Self.webPush(p256dh: key), [p])
            }
            let a = "target.web_push.auth"
            for auth in [
                "", "BTBZMqHH6r4Tts7J_aSIgg=x", Base64URL.encode(SecureRandom.bytes(15)), Base64URL.encode(SecureRandom.bytes(17)),
                "BTBZMqHH6r4Tts7J/aSIgg",
            ] {
                await bad(Self.webPush(auth: auth), [a])
            }
            await bad(Self.webPush("http://x", p256dh: "AAAA", auth: ""), [e, p, a])
            #expect(try await Self.list(env, alice).isEmpty)  // nothing was stored

            // The ends of every range are accepted.
            for target in [
                Self.apns(Self.randomHex(bytes: 32), label: String(repeating: "x", count: 64)), Self.apns(Self.randomHex(bytes: 100)),
                Self.apns(topic: String(repeating: "a", count: 255)), Self.apns(topic: "A-1.b-2.C3"),
                Self.fcm(String(repeating: "x", count: 4096)), Self.fcm("!~"),
                Self.webPush("https://push.example.net/" + String(repeating: "a", count: 2048 - 25)),
                Self.webPush("https://[2001:db8::1]:443/x?y=1&z=%2a"), Self.webPush("https://localhost:65535"),
            ] {
                _ = try await Self.register(env, target, by: alice)
                env.clock.advance(by: .seconds(1))
            }
            #expect(try await Self.list(env, alice).count == 9)
        }
    }

    @Test func eraseUserRemovesTheUsersTargetsOnly() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            let phone = Self.apns()
            _ = try await Self.register(env, phone, by: alice)
            _ = try await Self.register(env, Self.webPush(), by: alice)
            let bobs = try await Self.register(env, Self.fcm(), by: bob)
            func stored(_ user: String) throws -> Int64 {
                try env.core.database.readSync { c in
                    try c.queryOne("SELECT count(*) FROM push_targets WHERE user_id = ?", user)!.get(0, as: Int64.self)
                }
            }
            #expect(try stored(alice.id) == 2)
            var erase = Social_V1_EraseUserRequest()
            erase.eventId = "accounts:\(ULID.make())"
            erase.userId = alice.id
            #expect(!(try await env.internalAPI.eraseUser(erase).replayed))
            #expect(try stored(alice.id) == 0)
            #expect(try await Self.list(env, bob).map(\.targetId) == [bobs.target.targetId])
            // Her token is free: the next user of the phone registers it afresh.
            let next = try await Self.register(env, phone, by: carol)
            #expect(try await Self.list(env, carol).map(\.targetId) == [next.target.targetId])
            // Her own calls are refused from now on.
            await expectFailure(.unauthenticated) { try await Self.register(env, Self.fcm(), by: alice) }
            #expect(try stored(alice.id) == 0)
        }
    }

    @Test func guestsCannotRegisterAndCallsWithoutATokenAreRefused() async throws {
        try await withSocial(tasksUp: false) { env in
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            let options = bearer(guest.session.accessToken)
            var r = Social_V1_RegisterPushTargetRequest()
            r.target = Self.fcm()
            let refused = await expectFailure(.permissionDenied) { try await env.social.registerPushTarget(r, options: options) }
            #expect(refused?.message.contains("UpgradeGuest") == true)
            #expect(try await env.social.listPushTargets(Social_V1_ListPushTargetsRequest(), options: options).targets.isEmpty)

            await expectFailure(.unauthenticated) { try await env.social.registerPushTarget(r) }
            await expectFailure(.unauthenticated) { try await env.social.listPushTargets(Social_V1_ListPushTargetsRequest()) }
            var remove = Social_V1_RemovePushTargetRequest()
            remove.targetId = ULID.make()
            await expectFailure(.unauthenticated) { try await env.social.removePushTarget(remove) }
            await expectFailure(.unauthenticated) { try await env.social.registerPushTarget(r, options: bearer("e30.e30.AAAA")) }
            #expect(try env.core.database.readSync { c in try c.queryOne("SELECT count(*) FROM push_targets")!.get(0, as: Int64.self) } == 0)
        }
    }
}
