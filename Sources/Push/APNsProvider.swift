import Foundation
import Logging
import NIOHTTP1
import Security
import Synchronization

/// Apple Push Notification service (the provider API over HTTP/2 with token-based
/// authentication): `POST /3/device/<token>` with an ES256 provider token from the team's `.p8`
/// key, the app's bundle id as `apns-topic`, an alert push carrying the unread count as badge.
public final class APNsProvider: PushProvider {
    public struct Credentials: Sendable {
        public var keyID: String
        public var teamID: String
        public var key: P256.PrivateKey

        public init(keyID: String, teamID: String, key: P256.PrivateKey) {
            self.keyID = keyID
            self.teamID = teamID
            self.key = key
        }
    }

    /// Apple's hosts; tests point both at a local server.
    public static let productionURL = "https://api.push.apple.com"
    public static let sandboxURL = "https://api.sandbox.push.apple.com"
    /// A provider token is renewed after this long: Apple refuses one older than an hour
    /// (ExpiredProviderToken) and one renewed more often than every 20 minutes
    /// (TooManyProviderTokenUpdates).
    public static let tokenLifetime: Int64 = 50 * 60
    /// The largest body APNs takes for an alert.
    public static let maximumPayloadBytes = 4096

    public let kind = PushProviderKind.apns
    let credentials: Credentials
    let productionURL: String
    let sandboxURL: String
    let http: PushHTTP
    let clock: @Sendable () -> Int64
    private let token = Mutex<(value: String, issuedAt: Int64)?>(nil)

    public init(
        credentials: Credentials, http: PushHTTP, productionURL: String = APNsProvider.productionURL,
        sandboxURL: String = APNsProvider.sandboxURL, clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) {
        self.credentials = credentials
        self.http = http
        self.productionURL = productionURL.trimmingSuffix("/")
        self.sandboxURL = sandboxURL.trimmingSuffix("/")
        self.clock = clock
    }

    /// The current provider token, signed anew when it is `tokenLifetime` old (or `renew`).
    func providerToken(renew: String? = nil) -> String {
        let now = clock()
        return token.withLock { cached in
            // A clock stepping back a little keeps the token (re-signing per send would be refused).
            if let c = cached, c.value != renew, now >= c.issuedAt - 300, now - c.issuedAt < Self.tokenLifetime { return c.value }
            let value = JWT.apnsProviderToken(teamID: credentials.teamID, keyID: credentials.keyID, issuedAt: now, key: credentials.key)
            cached = (value, now)
            return value
        }
    }

    static func payload(_ m: PushMessage) -> [UInt8] {
        var aps: [String: Any] = ["alert": ["title": m.title, "body": m.body], "badge": m.badge, "thread-id": m.kind]
        if m.urgent { aps["sound"] = "default" }
        var root: [String: Any] = ["aps": aps]
        for (k, v) in m.appFields where k != "aps" { root[k] = v }
        return PushJSON.encode(root)
    }

    public func send(_ message: PushMessage, to device: PushDevice) async -> PushOutcome {
        guard case .apns(let deviceToken, let topic, let sandbox) = device else { return .refused("not an APNs device") }
        guard let fitted = message.fitted(into: Self.maximumPayloadBytes, encodedSize: { Self.payload($0).count }) else {
            return .refused("the payload does not fit APNs' \(Self.maximumPayloadBytes) bytes even with empty texts")
        }
        let body = Self.payload(fitted)
        let url = (sandbox ? sandboxURL : productionURL) + "/3/device/" + deviceToken
        let used = providerToken()
        var outcome = await post(url, topic: topic, message: fitted, body: body, token: used)
        // An expired token is renewed and the push sent again at once, once. Only the token that
        // was refused is renewed: sends refused together renew it once, not once each.
        if case .retry(let reason, _, _) = outcome, reason.contains("ExpiredProviderToken") {
            outcome = await post(url, topic: topic, message: fitted, body: body, token: providerToken(renew: used))
        }
        return outcome
    }

    private func post(_ url: String, topic: String, message: PushMessage, body: [UInt8], token: String) async -> PushOutcome {
        var headers = HTTPHeaders()
        headers.add(name: "authorization", value: "bearer \(token)")
        headers.add(name: "apns-topic", value: topic)
        headers.add(name: "apns-push-type", value: "alert")
        headers.add(name: "apns-priority", value: message.urgent ? "10" : "5")
        headers.add(name: "apns-expiration", value: String(max(0, message.expiresAt)))
        headers.add(name: "apns-collapse-id", value: message.notificationID)
        headers.add(name: "content-type", value: "application/json")
        let response: PushHTTP.Response
        do {
            response = try await http.post(url, headers: headers, body: body)
        } catch {
            return .retry("APNs unreachable: \(error)", retryAfter: nil, providerWide: true)
        }
        return Self.outcome(response)
    }

    /// Apple's answers ("Handling notification responses from APNs").
    static func outcome(_ r: PushHTTP.Response) -> PushOutcome {
        if r.status == 200 { return .delivered }
        let reason = PushJSON.decode(r.body)?["reason"] as? String ?? ""
        let summary = PushJSON.summary(r.status, reason)
        switch (r.status, reason) {
        case (410, _), (400, "BadDeviceToken"), (400, "DeviceTokenNotForTopic"), (400, "Unregistered"):
            return .gone(summary)
        case (403, "ExpiredProviderToken"):
            return .retry(summary, retryAfter: .seconds(1), providerWide: false)
        case (403, _):
            // InvalidProviderToken, MissingProviderToken, BadCertificate…: our credentials, not
            // the device: every APNs push waits.
            return .retry(summary, retryAfter: PushHTTP.retryAfter(r.header("retry-after")), providerWide: true)
        case (429, _):
            // TooManyRequests: too many pushes to this one device token.
            return .retry(summary, retryAfter: PushHTTP.retryAfter(r.header("retry-after")), providerWide: false)
        case (500..., _), (404, _), (405, _):
            // 404 BadPath / 405: a wrong PUSH_APNS_URL, not this push: every APNs push waits.
            return .retry(summary, retryAfter: PushHTTP.retryAfter(r.header("retry-after")), providerWide: true)
        default:
            return .refused(summary)
        }
    }

    public func shutdown() async {}
}

extension String {
    func trimmingSuffix(_ suffix: String) -> String {
        var s = self
        while s.hasSuffix(suffix) { s.removeLast(suffix.count) }
        return s
    }
}
