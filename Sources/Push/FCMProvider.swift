import Foundation
import NIOHTTP1
import Security
import Synchronization

/// Firebase Cloud Messaging's HTTP v1 API: `POST /v1/projects/<project>/messages:send` with an
/// OAuth 2.0 access token, which a service account gets by signing a JWT (RS256) and exchanging it
/// at the account's `token_uri`; the token is kept until a minute before it expires.
public final class FCMProvider: PushProvider {
    /// The fields of a service account's JSON key file that sending needs.
    public struct ServiceAccount: Sendable, Decodable {
        public var projectID: String
        public var clientEmail: String
        public var privateKeyID: String?
        public var privateKey: String
        public var tokenURI: String

        enum CodingKeys: String, CodingKey {
            case projectID = "project_id", clientEmail = "client_email", privateKeyID = "private_key_id"
            case privateKey = "private_key", tokenURI = "token_uri"
        }

        public static func load(path: String) throws -> ServiceAccount {
            let data: Data
            do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
                throw PushConfigurationError("cannot read the FCM service account file \(path): \(error.localizedDescription)")
            }
            do { return try JSONDecoder().decode(ServiceAccount.self, from: data) } catch {
                throw PushConfigurationError("\(path) is not a service account key (project_id, client_email, private_key, token_uri)")
            }
        }
    }

    public static let baseURL = "https://fcm.googleapis.com"
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"
    /// FCM takes at most 4096 bytes of message content.
    public static let maximumPayloadBytes = 4096

    public let kind = PushProviderKind.fcm
    let account: ServiceAccount
    let key: RSAPrivateKey
    let baseURL: String
    let http: PushHTTP
    let clock: @Sendable () -> Int64
    private let tokens: AccessTokens

    public init(
        account: ServiceAccount, http: PushHTTP, baseURL: String = FCMProvider.baseURL,
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) throws {
        self.account = account
        do { key = try RSAPrivateKey(pem: account.privateKey) } catch {
            throw PushConfigurationError("the FCM service account's private_key is not an RSA key of 2048 bits or more: \(error)")
        }
        self.baseURL = baseURL.trimmingSuffix("/")
        self.http = http
        self.clock = clock
        tokens = AccessTokens()
    }

    /// The access token: one exchange at a time, shared by every send until a minute before it
    /// expires (or until FCM refuses it).
    actor AccessTokens {
        var current: (token: String, expiresAt: Int64)?
        var pending: Task<(token: String, expiresAt: Int64), any Error>?

        func get(
            now: Int64, refusing stale: String?, fetch: @escaping @Sendable () async throws -> (token: String, expiresAt: Int64)
        ) async throws
            -> String
        {
            if let c = current, c.token != stale, now < c.expiresAt - 60 { return c.token }
            if let pending { return try await pending.value.token }
            let task = Task { try await fetch() }
            pending = task
            defer { pending = nil }
            do {
                let fresh = try await task.value
                current = fresh
                return fresh.token
            } catch {
                current = nil
                throw error
            }
        }
    }

    struct TokenError: Error, CustomStringConvertible {
        var description: String
    }

    private func fetchToken() async throws -> (token: String, expiresAt: Int64) {
        let now = clock()
        let assertion = try JWT.googleServiceAccountAssertion(
            clientEmail: account.clientEmail, scope: Self.scope, issuedAt: now, audience: account.tokenURI, keyID: account.privateKeyID,
            key: key)
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"
        let r = try await http.post(account.tokenURI, headers: headers, body: Array(form.utf8))
        guard r.status == 200, let json = PushJSON.decode(r.body), let token = json["access_token"] as? String, !token.isEmpty else {
            let detail = PushJSON.decode(r.body).flatMap { $0["error"] as? String } ?? ""
            throw TokenError(description: "the OAuth token exchange answered \(PushJSON.summary(r.status, detail))")
        }
        let lifetime = min(max((json["expires_in"] as? NSNumber)?.int64Value ?? 3600, 60), 86400)
        return (token, now + lifetime)
    }

    static func body(_ m: PushMessage, token: String, now: Int64) -> [UInt8] {
        let ttl = max(0, m.expiresAt - now)
        var data: [String: String] = [:]
        // FCM refuses these keys in data (reserved words and prefixes).
        for (k, v) in m.appFields where !(["from", "notification", "message_type"].contains(k) || k.hasPrefix("google") || k.hasPrefix("gcm")) {
            data[k] = v
        }
        let message: [String: Any] = [
            "token": token,
            "notification": ["title": m.title, "body": m.body],
            "data": data,
            "android": [
                "priority": m.urgent ? "HIGH" : "NORMAL", "ttl": "\(ttl)s",
                "notification": ["tag": m.notificationID, "notification_count": m.badge],
            ],
            "apns": [
                "headers": ["apns-collapse-id": m.notificationID, "apns-expiration": String(max(0, m.expiresAt))],
                "payload": ["aps": ["badge": m.badge]],
            ],
            "webpush": ["headers": ["Topic": m.notificationID, "TTL": String(ttl)]],
        ]
        return PushJSON.encode(["message": message])
    }

    public func send(_ message: PushMessage, to device: PushDevice) async -> PushOutcome {
        guard case .fcm(let registration) = device else { return .refused("not an FCM device") }
        let now = clock()
        guard let fitted = message.fitted(into: Self.maximumPayloadBytes, encodedSize: { Self.body($0, token: "", now: now).count }) else {
            return .refused("the message does not fit FCM's \(Self.maximumPayloadBytes) bytes even with empty texts")
        }
        let body = Self.body(fitted, token: registration, now: now)
        var refused: String?
        for _ in 0..<2 {
            let bearer: String
            do {
                bearer = try await tokens.get(now: clock(), refusing: refused) { [self] in try await fetchToken() }
            } catch {
                return .retry("no FCM access token: \(error)", retryAfter: nil, providerWide: true)
            }
            var headers = HTTPHeaders()
            headers.add(name: "authorization", value: "Bearer \(bearer)")
            headers.add(name: "content-type", value: "application/json; charset=utf-8")
            let r: PushHTTP.Response
            do {
                r = try await http.post("\(baseURL)/v1/projects/\(account.projectID)/messages:send", headers: headers, body: body)
            } catch {
                return .retry("FCM unreachable: \(error)", retryAfter: nil, providerWide: true)
            }
            // A refused access token (revoked, clock skew) is exchanged anew once.
            if r.status == 401, refused == nil {
                refused = bearer
                continue
            }
            return Self.outcome(r)
        }
        return .retry("FCM refuses fresh access tokens", retryAfter: nil, providerWide: true)
    }

    /// FCM's answers: the HTTP status and, in `error.details`, an `FcmError` with its `errorCode`.
    static func outcome(_ r: PushHTTP.Response) -> PushOutcome {
        if r.status == 200 { return .delivered }
        let error = PushJSON.decode(r.body)?["error"] as? [String: Any]
        let details = error?["details"] as? [[String: Any]] ?? []
        let code =
            details.compactMap { $0["errorCode"] as? String }.first ?? error?["status"] as? String ?? ""
        let summary = PushJSON.summary(r.status, code)
        let after = PushHTTP.retryAfter(r.header("retry-after"))
        let message = error?["message"] as? String ?? ""
        switch (r.status, code) {
        case (_, "UNREGISTERED"), (403, "SENDER_ID_MISMATCH"):
            return .gone(summary)
        case (400, _) where message.localizedCaseInsensitiveContains("registration token"):
            // "The registration token is not a valid FCM registration token": Google's advice is to remove it.
            return .gone(summary)
        case (404, _):
            // Not the device (that is UNREGISTERED): a wrong base URL or project. Nothing is removed.
            return .retry(summary, retryAfter: after, providerWide: true)
        case (429, _), (_, "QUOTA_EXCEEDED"):
            // An FcmError QUOTA_EXCEEDED is this device's (or topic's) message rate; a 429 without
            // one is the project's quota: every FCM push waits. Google says when to come back.
            let hasFcmError = details.contains { $0["errorCode"] != nil }
            return .retry(summary, retryAfter: after ?? .seconds(60), providerWide: !hasFcmError)
        case (500..., _), (_, "UNAVAILABLE"), (_, "INTERNAL"):
            return .retry(summary, retryAfter: after, providerWide: true)
        case (401, _), (403, _):
            return .retry(summary, retryAfter: after, providerWide: true)
        default:
            return .refused(summary)
        }
    }

    public func shutdown() async {}
}

/// A push credential or setting that cannot be used: the process refuses to start with it.
public struct PushConfigurationError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
