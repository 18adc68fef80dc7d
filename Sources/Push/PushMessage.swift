import Foundation

/// What a device shows for one stored notification: the same for every provider, each provider
/// puts it in its own shape.
public struct PushMessage: Sendable, Hashable {
    /// The notification's id: also the collapse key of every provider (`apns-collapse-id`, FCM's
    /// `tag`, Web Push's `Topic`), so a send retried after a lost answer replaces what the device
    /// shows instead of showing it twice.
    public var notificationID: String
    /// The notification kind's contract name without its prefix (`TASK_REMINDER`).
    public var kind: String
    public var title: String
    public var body: String
    /// The recipient's unread count when the push leaves (the app icon's badge).
    public var badge: Int
    /// The notification's `data`, passed through for the app.
    public var data: [String: String]
    /// Unix seconds after which the provider must not deliver it any more (stale).
    public var expiresAt: Int64
    /// Deliver at once, waking the device (high priority), rather than when convenient.
    public var urgent: Bool

    public init(
        notificationID: String, kind: String, title: String, body: String, badge: Int, data: [String: String] = [:],
        expiresAt: Int64, urgent: Bool = true
    ) {
        self.notificationID = notificationID
        self.kind = kind
        self.title = title
        self.body = body
        self.badge = badge
        self.data = data
        self.expiresAt = expiresAt
        self.urgent = urgent
    }

    /// The message with its body, then its title, shortened (at character boundaries, with "…")
    /// until `encodedSize` says it fits `limit` bytes; nil when even empty texts do not fit.
    func fitted(into limit: Int, encodedSize: (PushMessage) -> Int) -> PushMessage? {
        var m = self
        for field in [\PushMessage.body, \PushMessage.title] {
            if encodedSize(m) <= limit { return m }
            let text = Array(m[keyPath: field])
            let base = m
            func cut(_ n: Int) -> PushMessage {
                var c = base
                c[keyPath: field] = n == 0 ? "" : String(text[..<n]) + "…"
                return c
            }
            // The longest prefix that fits (the whole text did not): about log₂(count) tries.
            var low = 0
            var high = text.count - 1
            while low < high {
                let mid = (low + high + 1) / 2
                if encodedSize(cut(mid)) <= limit { low = mid } else { high = mid - 1 }
            }
            m = cut(low)
        }
        return encodedSize(m) <= limit ? m : nil
    }
}

/// The providers, numbered as social stores them (`push_targets.kind`).
public enum PushProviderKind: Int, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case apns = 1
    case fcm = 2
    case webPush = 3

    public var description: String {
        switch self {
        case .apns: "apns"
        case .fcm: "fcm"
        case .webPush: "webpush"
        }
    }
}

/// Where one push goes: a registered device or browser.
public enum PushDevice: Sendable, Hashable {
    case apns(deviceToken: String, topic: String, sandbox: Bool)
    case fcm(registrationToken: String)
    case webPush(endpoint: String, p256dh: [UInt8], auth: [UInt8])

    public var provider: PushProviderKind {
        switch self {
        case .apns: .apns
        case .fcm: .fcm
        case .webPush: .webPush
        }
    }
}

/// What became of one send.
public enum PushOutcome: Sendable, Hashable {
    /// The provider accepted it.
    case delivered
    /// The provider says this token or subscription will never work again (APNs 410 or
    /// BadDeviceToken, FCM UNREGISTERED, Web Push 404/410): remove the target.
    case gone(String)
    /// This message will never be accepted as it is (too large, refused as malformed): drop it and
    /// keep the target.
    case refused(String)
    /// Try again later: after `retryAfter` when the provider said how long, else after the
    /// device's own backoff. `providerWide` when the provider itself (not this device) is failing:
    /// the whole provider pauses, the other providers go on.
    case retry(String, retryAfter: Duration?, providerWide: Bool)
}

/// One provider's protocol. `send` never throws: every failure is an outcome.
public protocol PushProvider: Sendable {
    var kind: PushProviderKind { get }
    func send(_ message: PushMessage, to device: PushDevice) async -> PushOutcome
    func shutdown() async
}

extension PushMessage {
    /// The fields every payload carries for the app beside what it displays.
    var appFields: [String: String] {
        var fields = data
        fields["notification_id"] = notificationID
        fields["kind"] = kind
        return fields
    }
}
