import Foundation
import Security

/// Which providers a process pushes through and with what credentials. Each provider is on only
/// when its credentials are given; none given, nothing is pushed (notifications still reach the
/// inbox and the live streams).
public struct PushSettings: Sendable {
    public struct APNs: Sendable {
        /// The `.p8` key Apple issues (PKCS#8 PEM, P-256).
        public var keyFile: String
        public var keyID: String
        public var teamID: String
        public var productionURL = APNsProvider.productionURL
        public var sandboxURL = APNsProvider.sandboxURL

        public init(keyFile: String, keyID: String, teamID: String) {
            self.keyFile = keyFile
            self.keyID = keyID
            self.teamID = teamID
        }
    }

    public struct FCM: Sendable {
        /// The service account's JSON key file (its `token_uri` is where tokens come from).
        public var serviceAccountFile: String
        public var baseURL = FCMProvider.baseURL

        public init(serviceAccountFile: String) { self.serviceAccountFile = serviceAccountFile }
    }

    public struct WebPush: Sendable {
        /// The VAPID private key (PEM, P-256); its public key is the applicationServerKey the web
        /// app subscribes with.
        public var vapidKeyFile: String
        /// The operator's contact for push services: `mailto:` or `https:`.
        public var subject: String

        public init(vapidKeyFile: String, subject: String) {
            self.vapidKeyFile = vapidKeyFile
            self.subject = subject
        }
    }

    public var apns: APNs?
    public var fcm: FCM?
    public var webPush: WebPush?
    /// Certificates trusted beside the system's for the providers' TLS (a test server's CA).
    public var trustRootsFile: String?
    /// Web Push endpoints on loopback or private addresses are refused unless this is set (tests).
    public var allowPrivateEndpoints = false
    /// One request to a provider, connection included.
    public var requestTimeout: Duration = .seconds(10)

    public init() {}

    public var isEmpty: Bool { apns == nil && fcm == nil && webPush == nil }
}

/// The configured providers, built once at start: a key file that is missing or wrong refuses the
/// start with a message naming it.
public final class PushProviders: Sendable {
    public let all: [PushProviderKind: any PushProvider]
    let http: PushHTTP?

    public init(_ settings: PushSettings, clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }) throws {
        guard !settings.isEmpty else {
            all = [:]
            http = nil
            return
        }
        let http = PushHTTP(extraTrustRootsFile: settings.trustRootsFile, timeout: settings.requestTimeout)
        var all: [PushProviderKind: any PushProvider] = [:]
        do {
            if let a = settings.apns {
                let key = try Self.p256(a.keyFile, "the APNs key")
                all[.apns] = APNsProvider(
                    credentials: .init(keyID: a.keyID, teamID: a.teamID, key: key), http: http, productionURL: a.productionURL,
                    sandboxURL: a.sandboxURL, clock: clock)
            }
            if let f = settings.fcm {
                all[.fcm] = try FCMProvider(account: .load(path: f.serviceAccountFile), http: http, baseURL: f.baseURL, clock: clock)
            }
            if let w = settings.webPush {
                let key = try Self.p256(w.vapidKeyFile, "the VAPID key")
                all[.webPush] = try WebPushProvider(
                    key: key, subject: w.subject, http: http, allowPrivateEndpoints: settings.allowPrivateEndpoints, clock: clock)
            }
        } catch {
            let client = http
            Task { await client.shutdown() }
            throw error
        }
        self.all = all
        self.http = http
    }

    /// Providers given directly (tests).
    public init(providers: [any PushProvider]) {
        all = Dictionary(providers.map { ($0.kind, $0) }, uniquingKeysWith: { a, _ in a })
        http = nil
    }

    public var isEmpty: Bool { all.isEmpty }

    public func shutdown() async {
        for p in all.values { await p.shutdown() }
        await http?.shutdown()
    }

    static func p256(_ path: String, _ what: String) throws -> P256.PrivateKey {
        do { return try P256.PrivateKey.load(path: path) } catch {
            throw PushConfigurationError("\(what) \(path) cannot be used: \(error)")
        }
    }
}
