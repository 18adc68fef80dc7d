import Contracts
import Foundation
import NIOHTTP1
import Testing

@testable import Push
@testable import Social

/// The pure parts of pushing: quiet hours across daylight-saving days, the providers' answers,
/// Retry-After, shortening to fit, which endpoint addresses are public.
@Suite("Social: push rules")
struct PushRulesTests {
    static func ms(_ iso: String) -> Int64 {
        let f = ISO8601DateFormatter()
        return Int64(f.date(from: iso)!.timeIntervalSince1970 * 1000)
    }

    static func quiet(_ start: Int, _ end: Int, _ zone: String) -> PushPreferenceRules.QuietHours {
        .init(start: start, end: end, zone: TimeZone(identifier: zone)!)
    }

    @Test func quietHoursSpanMidnightInTheUsersZone() {
        let night = Self.quiet(22 * 60, 7 * 60, "Europe/Berlin")
        // 21:59 Berlin (CET, UTC+1) is outside; 22:00 and 06:59 inside; 07:00 outside.
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-01-10T20:59:00Z")) == nil)
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-01-10T21:00:00Z")) == Self.ms("2027-01-11T06:00:00Z"))
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-01-11T05:59:00Z")) == Self.ms("2027-01-11T06:00:00Z"))
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-01-11T06:00:00Z")) == nil)
        // A daytime span.
        let day = Self.quiet(9 * 60, 17 * 60, "America/New_York")
        #expect(PushPreferenceRules.quietUntil(day, now: Self.ms("2027-07-01T13:00:00Z")) == Self.ms("2027-07-01T21:00:00Z"))
        #expect(PushPreferenceRules.quietUntil(day, now: Self.ms("2027-07-01T12:59:00Z")) == nil)
    }

    @Test func quietHoursOnDaylightSavingDays() {
        // Berlin springs forward on 2027-03-28 at 02:00 → 03:00: quiet until 02:30 ends at 03:00.
        let spring = Self.quiet(0, 2 * 60 + 30, "Europe/Berlin")
        #expect(PushPreferenceRules.quietUntil(spring, now: Self.ms("2027-03-28T00:30:00Z")) == Self.ms("2027-03-28T01:00:00Z"))
        // Falls back on 2027-10-31 at 03:00 → 02:00: quiet 01:00–02:30 ends at the first 02:30.
        let fall = Self.quiet(60, 2 * 60 + 30, "Europe/Berlin")
        #expect(PushPreferenceRules.quietUntil(fall, now: Self.ms("2027-10-30T23:30:00Z")) == Self.ms("2027-10-31T00:30:00Z"))
        // A normal night is 8 hours in winter and in summer alike (local clock, not UTC).
        let night = Self.quiet(23 * 60, 7 * 60, "Europe/Berlin")
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-07-01T21:00:00Z")) == Self.ms("2027-07-02T05:00:00Z"))
        #expect(PushPreferenceRules.quietUntil(night, now: Self.ms("2027-01-01T22:00:00Z")) == Self.ms("2027-01-02T06:00:00Z"))
    }

    @Test func shortLivedKindsAndLifetimes() {
        for kind in [Social_V1_NotificationKind.matchFound, .rematchRequest, .matchChatMessage] {
            #expect(PushPreferenceRules.isShortLived(kind))
            #expect(PushPreferenceRules.lifetime(kind) == 15 * 60 * 1000)
        }
        #expect(!PushPreferenceRules.isShortLived(.taskReminder))
        #expect(PushPreferenceRules.lifetime(.challenge) == 24 * 3600 * 1000)
        #expect(Social_V1_NotificationKind.taskReminder.contractName == "TASK_REMINDER")
        #expect(Social_V1_NotificationKind(rawValue: 999).contractName == "999")
    }

    static func response(_ status: Int, _ body: String = "", retryAfter: String? = nil) -> PushHTTP.Response {
        var h = HTTPHeaders()
        if let retryAfter { h.add(name: "retry-after", value: retryAfter) }
        return PushHTTP.Response(status: status, headers: h, body: Array(body.utf8))
    }

    @Test func apnsAnswers() {
        #expect(APNsProvider.outcome(Self.response(200)) == .delivered)
        if case .gone = APNsProvider.outcome(Self.response(410, #"{"reason":"Unregistered","timestamp":1}"#)) {} else { Issue.record("410") }
        if case .gone = APNsProvider.outcome(Self.response(400, #"{"reason":"BadDeviceToken"}"#)) {} else { Issue.record("BadDeviceToken") }
        if case .refused = APNsProvider.outcome(Self.response(413, #"{"reason":"PayloadTooLarge"}"#)) {} else { Issue.record("413") }
        if case .retry(_, let after, let wide) = APNsProvider.outcome(Self.response(429, #"{"reason":"TooManyRequests"}"#, retryAfter: "7")) {
            #expect(after == .seconds(7) && !wide)
        } else {
            Issue.record("429")
        }
        if case .retry(_, _, let wide) = APNsProvider.outcome(Self.response(403, #"{"reason":"InvalidProviderToken"}"#)) {
            #expect(wide)
        } else {
            Issue.record("403")
        }
        if case .retry(_, _, let wide) = APNsProvider.outcome(Self.response(503)) { #expect(wide) } else { Issue.record("503") }
        if case .retry(_, _, let wide) = APNsProvider.outcome(Self.response(404, #"{"reason":"BadPath"}"#)) {
            #expect(wide)
        } else {
            Issue.record("404")
        }
    }

    static func fcmError(_ code: Int, _ status: String, _ errorCode: String) -> String {
        #"{"error":{"code":\#(code),"status":"\#(status)","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"\#(errorCode)"}]}}"#
    }

    @Test func fcmAnswers() {
        #expect(FCMProvider.outcome(Self.response(200, #"{"name":"projects/p/messages/1"}"#)) == .delivered)
        if case .gone = FCMProvider.outcome(Self.response(404, Self.fcmError(404, "NOT_FOUND", "UNREGISTERED"))) {
        } else {
            Issue.record("UNREGISTERED")
        }
        if case .gone = FCMProvider.outcome(Self.response(403, Self.fcmError(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"))) {
        } else {
            Issue.record("SENDER_ID_MISMATCH")
        }
        // A 404 without UNREGISTERED is a wrong URL or project: nothing is removed.
        if case .retry(_, _, let wide) = FCMProvider.outcome(Self.response(404, "not found")) { #expect(wide) } else { Issue.record("404") }
        // QUOTA_EXCEEDED in an FcmError is this device's rate; a 429 without one is the project's.
        if case .retry(_, let after, let wide) = FCMProvider.outcome(
            Self.response(429, Self.fcmError(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), retryAfter: "30"))
        {
            #expect(after == .seconds(30) && !wide)
        } else {
            Issue.record("429 QUOTA_EXCEEDED")
        }
        if case .retry(_, _, let wide) = FCMProvider.outcome(
            Self.response(429, #"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Quota exceeded"}}"#))
        {
            #expect(wide)
        } else {
            Issue.record("429 project")
        }
        if case .gone = FCMProvider.outcome(
            Self.response(
                400, #"{"error":{"code":400,"status":"INVALID_ARGUMENT","message":"The registration token is not a valid FCM registration token"}}"#)
        ) {
        } else {
            Issue.record("invalid token")
        }
        if case .refused = FCMProvider.outcome(Self.response(400, Self.fcmError(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"))) {
        } else {
            Issue.record("400")
        }
    }

    @Test func webPushAnswers() {
        #expect(WebPushProvider.outcome(Self.response(201)) == .delivered)
        for gone in [404, 410] {
            if case .gone = WebPushProvider.outcome(Self.response(gone)) {} else { Issue.record("\(gone)") }
        }
        if case .retry(_, let after, let wide) = WebPushProvider.outcome(Self.response(429, retryAfter: "Wed, 21 Oct 2099 07:28:00 GMT")) {
            #expect(after == .seconds(24 * 3600) && !wide)  // clamped to a day
        } else {
            Issue.record("429")
        }
        if case .refused = WebPushProvider.outcome(Self.response(413)) {} else { Issue.record("413") }
        if case .retry(_, _, let wide) = WebPushProvider.outcome(Self.response(403)) { #expect(!wide) } else { Issue.record("403") }
        #expect(WebPushProvider.isTopic("01JEXAMPLE0000000000000000"))
        #expect(!WebPushProvider.isTopic(String(repeating: "a", count: 33)))
        #expect(!WebPushProvider.isTopic("a b"))
    }

    @Test func retryAfterForms() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(PushHTTP.retryAfter("120", now: now) == .seconds(120))
        #expect(PushHTTP.retryAfter("0", now: now) == .seconds(1))
        #expect(PushHTTP.retryAfter(nil, now: now) == nil)
        #expect(PushHTTP.retryAfter("soon", now: now) == nil)
        let later = Date(timeIntervalSince1970: 1_800_000_090)
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        #expect(PushHTTP.retryAfter(f.string(from: later), now: now) == .seconds(90))
    }

    @Test func textsAreShortenedToFit() {
        let long = String(repeating: "ü", count: 5000)
        let m = PushMessage(notificationID: "01J", kind: "TASK_COMMENT", title: "Title", body: long, badge: 3, expiresAt: 0)
        let apns = m.fitted(into: APNsProvider.maximumPayloadBytes) { APNsProvider.payload($0).count }
        #expect(apns != nil)
        #expect(APNsProvider.payload(apns!).count <= 4096)
        #expect(apns!.body.hasSuffix("…"))
        #expect(apns!.body.count > 1000)
        #expect(apns!.title == "Title")
        let small = PushMessage(notificationID: "01J", kind: "K", title: "t", body: "b", badge: 0, expiresAt: 0)
        #expect(small.fitted(into: 4096) { APNsProvider.payload($0).count } == small)
        var huge = small
        huge.data = ["x": String(repeating: "x", count: 5000)]
        #expect(huge.fitted(into: 4096) { APNsProvider.payload($0).count } == nil)
    }

    @Test func publicAndPrivateAddresses() {
        func v4(_ s: String) -> [UInt8] { EndpointGuard.ipAddress(s)! }
        for s in [
            "127.0.0.1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
            "::1", "::", "fd00::1", "fe80::1", "::ffff:10.0.0.1", "ff02::1", "2001:db8::1", "192.0.2.1", "198.18.0.1",
            "fec0::1", "2001:0:4136:e378::1", "2002:0a00:0001::1", "64:ff9b::7f00:1", "64:ff9b:1::1", "100::1", "192.88.99.1",
        ] {
            #expect(!EndpointGuard.isPublic(v4(s)), "\(s)")
        }
        for s in ["8.8.8.8", "172.32.0.1", "142.250.74.46", "2a00:1450:4001:82b::200a", "::ffff:8.8.8.8", "2002:0808:0808::1", "64:ff9b::808:808"] {
            #expect(EndpointGuard.isPublic(v4(s)), "\(s)")
        }
    }

    @Test func localNamesAreRefusedWithoutResolving() async {
        #expect(await EndpointGuard.check("https://localhost:8443/push") != .public)
        #expect(await EndpointGuard.check("https://[::1]/push") != .public)
        #expect(await EndpointGuard.check("https://127.0.0.1/push") != .public)
        #expect(await EndpointGuard.check("https://metadata.internal/x") != .public)
        #expect(await EndpointGuard.check("https://8.8.8.8/push") == .public)
        #expect(await EndpointGuard.check("https://2130706433/push") != .public)  // 127.0.0.1 in decimal, through getaddrinfo
        #expect(PushPreferenceRules.zone(named: "GMT") != nil && PushPreferenceRules.zone(named: "Asia/Tokyo") != nil)
        #expect(PushPreferenceRules.zone(named: "CEST") == nil && PushPreferenceRules.zone(named: "+02:00") == nil)
        #expect(PushPreferenceRules.zone(named: "../../etc/passwd") == nil)
    }
}
