import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCServices
import RPCTLS
import RPCTransport
import Security
import ServiceKit
import Synchronization
import Testing

@testable import Gateway

/// Raw bytes as a message (for the test-only echo routes).
struct Bytes: ProtoMessage {
    static var protoMessageName: String { "test.Bytes" }
    var data: [UInt8] = []
    init() {}
    init(_ s: String) { data = Array(s.utf8) }
    init(serializedBytes: [UInt8]) throws { data = serializedBytes }
    func serializedBytes() -> [UInt8] { data }
    var text: String { String(decoding: data, as: UTF8.self) }
}

/// Signing keys of a fake accounts, and tokens signed with them.
final class TestKeys: Sendable {
    let pair = Ed25519KeyPair()
    let keyID: String
    init(keyID: String = "k1") { self.keyID = keyID }

    func token(
        user: String = "u-1", session: String = "s-1", expiresIn: Int64 = 600, keyID: String? = nil,
        kind: AccessTokenClaims.Kind = .user, signer: Ed25519KeyPair? = nil
    ) -> String {
        let now = AccessToken.currentTime()
        let claims = AccessTokenClaims(
            userID: user, sessionID: session, expiresAt: now + expiresIn,
            issuedAt: min(now, now + expiresIn - 1), keyID: keyID ?? self.keyID, kind: kind)
        return AccessToken.sign(claims, with: signer ?? pair)
    }
    var publicKeys: [String: Ed25519PublicKey] { [keyID: pair.publicKey] }
}

/// The keys the fake accounts publishes (tests rotate them).
final class KeyStore: Sendable {
    private let keys: Mutex<[(String, Ed25519PublicKey)]>
    init(_ keys: [(String, Ed25519PublicKey)]) { self.keys = Mutex(keys) }
    var all: [(String, Ed25519PublicKey)] { keys.withLock { $0 } }
    func add(_ id: String, _ key: Ed25519PublicKey) { keys.withLock { $0.append((id, key)) } }
    func remove(_ id: String) { keys.withLock { $0.removeAll { $0.0 == id } } }
}

/// What upstreams saw, by method path.
final class Recorder: Sendable {
    private let seen = Mutex<[String: [Metadata]]>([:])
    private let events = Mutex<[String]>([])
    func record(_ path: String, _ m: Metadata) { seen.withLock { $0[path, default: []].append(m) } }
    func last(_ path: String) -> Metadata? { seen.withLock { $0[path]?.last } }
    func count(_ path: String) -> Int { seen.withLock { $0[path]?.count ?? 0 } }
    func note(_ e: String) { events.withLock { $0.append(e) } }
    var notes: [String] { events.withLock { $0 } }
}

enum Fake {
    static let serviceToken = "test-service-token"
    static let gatewayToken = "test-gateway-token"

    /// A public fake of accounts.v1.Accounts: keys, LogIn, GetMyProfile (who the token says),
    /// SignUp (errors with details), UpdateProfile (echo), and one internal method.
    struct Accounts: RPCService {
        let keys: KeyStore
        let recorder: Recorder
        var serviceName: String { Accounts_V1_AccountsMethods.serviceName }
        var methods: [ServerMethod] {
            let recorder = self.recorder
            let keys = self.keys
            return [
                ServerMethod(
                    Accounts_V1_AccountsMethods.getSigningKeys,
                    .unary(Accounts_V1_GetSigningKeysRequest.self, Accounts_V1_GetSigningKeysResponse.self) { _, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        var r = Accounts_V1_GetSigningKeysResponse()
                        r.keys = keys.all.map { id, key in
                            var k = Accounts_V1_SigningKey()
                            k.keyId = id
                            k.algorithm = .ed25519
                            k.publicKey = key.rawRepresentation
                            return k
                        }
                        var d = Google_Protobuf_Duration()
                        d.seconds = 300
                        r.cacheFor = d
                        return r
                    }),
                ServerMethod(
                    Accounts_V1_AccountsMethods.logIn,
                    .unary(Accounts_V1_LogInRequest.self, Accounts_V1_LogInResponse.self) { req, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        if let v = ctx.requestMetadata["x-echo-initial"] { ctx.initialMetadata.add("x-echo-initial", v) }
                        if let v = ctx.requestMetadata["x-echo-trailer"] { ctx.trailers.add("x-echo-trailer", v) }
                        var r = Accounts_V1_LogInResponse()
                        var u = Accounts_V1_User()
                        u.userId = "u-\(req.username)"
                        u.username = req.username
                        u.displayName = "Ada \"L\" Ω"
                        u.guest = false
                        var ts = Google_Protobuf_Timestamp()
                        ts.seconds = 1_700_000_000
                        ts.nanos = 120_000_000
                        u.createdAt = ts
                        r.user = u
                        var s = Accounts_V1_Session()
                        s.sessionId = "s-1"
                        s.accessToken = "token-for-\(req.username)"
                        r.session = s
                        if req.password == "slow" {
                            // Polls rather than one long Task.sleep: a sleep under the server's
                            // event-loop executor does not wake when its task is cancelled.
                            for _ in 0..<250 {
                                if Task.isCancelled { recorder.note("login cancelled"); throw CancellationError() }
                                try? await Task.sleep(for: .milliseconds(20))
                            }
                        }
                        return r
                    }),
                ServerMethod(
                    Accounts_V1_AccountsMethods.getMyProfile,
                    .unary(Accounts_V1_GetMyProfileRequest.self, Accounts_V1_GetMyProfileResponse.self) { _, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        let id = try ctx.requireIdentity()
                        var r = Accounts_V1_GetMyProfileResponse()
                        var u = Accounts_V1_User()
                        u.userId = id.userID
                        u.displayName =
                            "remaining-ms:\(ctx.timeRemaining.map { $0.components.seconds * 1000 + $0.components.attoseconds / 1_000_000_000_000_000 } ?? -1)"
                        r.user = u
                        return r
                    }),
                ServerMethod(
                    Accounts_V1_AccountsMethods.signUp,
                    .unary(Accounts_V1_SignUpRequest.self, Accounts_V1_SignUpResponse.self) { req, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        if req.username == "taken" {
                            ctx.trailers.add("x-why", "duplicate")
                            throw FieldErrors.single(.alreadyExists, field: "username", "is taken")
                        }
                        // The upstream's own UNAVAILABLE, naming an address: the gateway passes it on as it is.
                        if req.username == "unavailable" { throw RPCError(.unavailable, "the fake's store at 127.0.0.1:1 is down") }
                        var e = FieldErrors()
                        if req.password.count < 8 { e.add("password", "must be at least 8 characters") }
                        try e.throwIfAny()
                        var r = Accounts_V1_SignUpResponse()
                        var u = Accounts_V1_User()
                        u.username = req.username
                        u.email = req.email
                        u.contactInfo = req.contactInfo
                        r.user = u
                        return r
                    }),
                ServerMethod(
                    Accounts_V1_AccountsMethods.updateProfile,
                    .unary(Accounts_V1_UpdateProfileRequest.self, Accounts_V1_UpdateProfileResponse.self) { req, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        var r = Accounts_V1_UpdateProfileResponse()
                        var u = Accounts_V1_User()
                        u.displayName = req.hasDisplayName ? "set:" + req.displayName.value : "unset"
                        u.email = req.hasEmail ? "set:" + req.email.value : "unset"
                        r.user = u
                        return r
                    }),
            ]
        }
    }

    /// Serves AccountsInternal too (the gateway must never reach it).
    struct AccountsInternal: RPCService {
        let recorder: Recorder
        var serviceName: String { Accounts_V1_AccountsInternalMethods.serviceName }
        var methods: [ServerMethod] {
            let recorder = recorder
            return [
                ServerMethod(
                    Accounts_V1_AccountsInternalMethods.getUsersByIds,
                    .unary(Accounts_V1_GetUsersByIdsRequest.self, Accounts_V1_GetUsersByIdsResponse.self) { _, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        return Accounts_V1_GetUsersByIdsResponse()
                    })
            ]
        }
    }

    /// social.v1.Social/SubscribeNotifications: `started`, then one notification every 20 ms
    /// until the client goes away (noted in the recorder). GetNotificationSettings sleeps for
    /// `x-sleep-ms`.
    struct Social: RPCService {
        let recorder: Recorder
        var serviceName: String { Social_V1_SocialMethods.serviceName }
        var methods: [ServerMethod] {
            let recorder = recorder
            return [
                ServerMethod(
                    Social_V1_SocialMethods.subscribeNotifications,
                    .serverStreaming(Social_V1_SubscribeNotificationsRequest.self, Social_V1_SubscribeNotificationsResponse.self) { req, out, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        _ = try ctx.requireIdentity()
                        ctx.initialMetadata.add("x-stream", "live")
                        var first = Social_V1_SubscribeNotificationsResponse()
                        var started = Social_V1_SubscriptionStarted()
                        started.unreadCount = 3
                        first.event = .started(started)
                        try await out.write(first)
                        let limit = Int(req.afterNotificationId) ?? Int.max
                        var i = 0
                        do {
                            while i < limit {
                                try await Task.sleep(for: .milliseconds(20))
                                var n = Social_V1_Notification()
                                n.notificationId = "n-\(i)"
                                n.title = "hello \(i)"
                                var m = Social_V1_SubscribeNotificationsResponse()
                                m.event = .notification(n)
                                try await out.write(m)
                                i += 1
                            }
                        } catch {
                            recorder.note("subscription ended: \(error)")
                            throw error
                        }
                        ctx.trailers.add("x-sent", String(i))
                    }),
                ServerMethod(
                    Social_V1_SocialMethods.getNotificationSettings,
                    .unary(Social_V1_GetNotificationSettingsRequest.self, Social_V1_GetNotificationSettingsResponse.self) { _, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        if let ms = ctx.requestMetadata["x-sleep-ms"].flatMap(Int.init) {
                            do { try await Task.sleep(for: .milliseconds(ms)) } catch {
                                recorder.note("settings cancelled")
                                throw error
                            }
                        }
                        return Social_V1_GetNotificationSettingsResponse()
                    }),
            ]
        }
    }

    static let chat = MethodDescriptor(service: "test.v1.Echo", method: "Chat", kind: .bidirectionalStreaming, visibility: .publicAnonymous)
    static let collect = MethodDescriptor(service: "test.v1.Echo", method: "Collect", kind: .clientStreaming, visibility: .publicAnonymous)
    static let expand = MethodDescriptor(service: "test.v1.Echo", method: "Expand", kind: .serverStreaming, visibility: .publicAnonymous)
    /// Messages `Expand` has written so far (its writes return once the transport took them).
    static let expandWritten = Atomic<Int>(0)

    /// Bidi and client-streaming echo (no public contract has those kinds yet).
    struct Echo: RPCService {
        let recorder: Recorder
        var serviceName: String { "test.v1.Echo" }
        var methods: [ServerMethod] {
            let recorder = recorder
            return [
                ServerMethod(
                    chat,
                    .bidirectionalStreaming(Bytes.self, Bytes.self) { reqs, out, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        for try await r in reqs {
                            if r.text == "fail" { throw RPCError(.failedPrecondition, "asked to fail") }
                            try await out.write(Bytes("echo:" + r.text))
                        }
                        ctx.trailers.add("x-done", "yes")
                    }),
                ServerMethod(
                    collect,
                    .clientStreaming(Bytes.self, Bytes.self) { reqs, ctx in
                        recorder.record(ctx.method.path, ctx.requestMetadata)
                        var total = 0
                        var n = 0
                        for try await r in reqs { total += r.data.count; n += 1 }
                        return Bytes("\(n) messages, \(total) bytes")
                    }),
                ServerMethod(
                    expand,
                    .serverStreaming(Bytes.self, Bytes.self) { req, out, _ in
                        // "n:size": n messages of size bytes, as fast as the client reads.
                        let parts = req.text.split(separator: ":").compactMap { Int($0) }
                        for i in 0..<(parts.first ?? 0) {
                            try await out.write(Bytes(String(repeating: String(i % 10), count: parts.count > 1 ? parts[1] : 1)))
                            Fake.expandWritten.add(1, ordering: .relaxed)
                        }
                    }),
            ]
        }
    }
}

/// Counts the calls that reach an upstream, before its own policy (which may refuse them).
final class Arrivals: ServerInterceptor {
    let count = Atomic<Int>(0)
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        count.add(1, ordering: .relaxed)
        return try await next(call)
    }
}

/// A fake upstream process: an RPCServer on 127.0.0.1:0 with health and the service policy.
final class FakeUpstream: Sendable {
    let server: RPCServer
    let port: Int
    /// Every call that reached it (its policy refuses some after this).
    let arrivals = Arrivals()

    init(services: [any RPCService], keys: KeyStore, port: Int = 0, tls: TLSConfiguration? = nil) async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: port, tls: tls)
        config.threads = 1
        config.initialWindowSize = 8 << 20
        config.interceptors = [
            arrivals,
            AuthInterceptor(
                keys: StaticSigningKeys { Dictionary(keys.all, uniquingKeysWith: { a, _ in a }) },
                serviceToken: Fake.serviceToken, gatewayToken: Fake.gatewayToken),
        ]
        let (_, all) = StandardServices.make(for: services, descriptors: ContractsDescriptors.descriptorSet)
        let server = RPCServer(configuration: config, services: all)
        self.server = server
        self.port = try await server.start()
    }

    func stop() async { await server.shutdownGracefully() }
}

/// Upstreams + gateway, all in-process on loopback.
final class Harness: Sendable {
    let keys = TestKeys()
    let keyStore: KeyStore
    let recorder = Recorder()
    let accounts: FakeUpstream
    let social: FakeUpstream
    let gateway: Gateway
    let port: Int
    let channel: RPCChannel

    init(configure: (inout GatewayConfiguration) -> Void = { _ in }) async throws {
        keyStore = KeyStore([(keys.keyID, keys.pair.publicKey)])
        accounts = try await FakeUpstream(
            services: [
                Fake.Accounts(keys: keyStore, recorder: recorder),
                Fake.AccountsInternal(recorder: recorder),
            ], keys: keyStore)
        social = try await FakeUpstream(services: [Fake.Social(recorder: recorder), Fake.Echo(recorder: recorder)], keys: keyStore)
        var config = GatewayConfiguration(
            upstreams: [
                .init(name: "accounts", host: "127.0.0.1", port: accounts.port),
                .init(name: "social", host: "127.0.0.1", port: social.port),
            ],
            gatewayToken: Fake.gatewayToken)
        config.threads = 2
        config.userRate = 1000
        config.userBurst = 1000
        config.addressRate = 1000
        config.addressBurst = 1000
        configure(&config)
        var logger = Logger(label: "gateway-test")
        logger.logLevel = .warning
        gateway = try Gateway(
            configuration: config, logger: logger,
            extraRoutes: ["test.v1.Echo": (upstream: "social", methods: [Fake.chat, Fake.collect, Fake.expand])])
        port = try await gateway.start()
        channel = RPCChannel(host: "127.0.0.1", port: port)
    }

    var client: RPCClient { channel.client }

    func bearer(_ token: String) -> Metadata { Metadata([("authorization", "Bearer \(token)")]) }

    func stop() async {
        await channel.close()
        await gateway.shutdown()
        await accounts.stop()
        await social.stop()
    }
}

/// Runs curl on a thread of its own (its blocking reads must not take one of the few threads the
/// concurrency runtime has: the gateway under test needs them); returns (HTTP status, headers
/// lower-cased, body).
func curl(_ args: [String]) async throws -> (status: Int, headers: [String: String], body: String) {
    try await withCheckedThrowingContinuation { c in
        let t = Thread { c.resume(with: Result { try curlBlocking(args) }) }
        t.start()
    }
}

func curlBlocking(_ args: [String]) throws -> (status: Int, headers: [String: String], body: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    let headerFile = FileManager.default.temporaryDirectory.appendingPathComponent("gw-curl-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: headerFile) }
    p.arguments = ["-s", "-S", "--max-time", "10", "-D", headerFile, "-o", "-"] + args
    let pipe = Pipe()
    p.standardOutput = pipe
    try p.run()
    let out = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    p.waitUntilExit()
    let (status, headers) = curlHeaders(headerFile)
    return (status, headers, out)
}

/// The last response's status and headers (names lower-cased) from curl's `-D` file.
func curlHeaders(_ file: String) -> (status: Int, headers: [String: String]) {
    let raw = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
    var status = 0
    var headers: [String: String] = [:]
    for line in raw.split(separator: "\r\n") {
        if line.hasPrefix("HTTP/") {
            status = Int(line.split(separator: " ")[1]) ?? 0
            headers = [:]
        } else if let colon = line.firstIndex(of: ":") {
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
    }
    return (status, headers)
}

/// Parses JSON test output with Foundation (an independent parser).
func json(_ s: String) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(s.utf8))) as? [String: Any] ?? [:]
}

/// Waits for a condition (polling), failing after `timeout`.
func eventually(timeout: Duration = .seconds(5), _ condition: () async throws -> Bool) async throws -> Bool {
    let end = ContinuousClock.now + timeout
    while ContinuousClock.now < end {
        if try await condition() { return true }
        try await Task.sleep(for: .milliseconds(20))
    }
    return false
}
