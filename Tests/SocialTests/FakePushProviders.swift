import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL
import Push
import ServiceKit
import Synchronization

/// Tests/PushProviders/fake_providers.py as a child process: APNs, FCM (with its token endpoint)
/// and a Web Push service on one TLS port of 127.0.0.1, each checking every request as the
/// provider documents it (its README). It exits when its stdin pipe closes, so a crashed test
/// leaves nothing behind.
final class FakePushProviders: Sendable {
    let port: Int
    let directory: String
    private let process: Process
    private let stdin: Pipe
    private let client: HTTPClient

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let python: String = {
        if let python = ProcessInfo.processInfo.environment["TEST_PYTHON"] { return python }
        let venv = root.appendingPathComponent(".venv/bin/python").path
        return FileManager.default.isExecutableFile(atPath: venv) ? venv : "python3"
    }()
    /// The Python side is there (a developer without `scripts/setup` skips); under CI it must be.
    static let available: Bool = {
        if ProcessInfo.processInfo.environment["CI"] == "true" { return true }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [python, "-c", "import hypercorn, http_ece, jwt"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }()

    /// Starts it over `directory` (its credentials are made there once and kept).
    init(directory: String) async throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [
            Self.python, Self.root.appendingPathComponent("Tests/PushProviders/fake_providers.py").path, "--dir", directory, "--port", "0",
        ]
        let input = Pipe(), output = Pipe()
        p.standardInput = input
        p.standardOutput = output
        if ProcessInfo.processInfo.environment["SOCIAL_TEST_LOG"] != "1" { p.standardError = FileHandle.nullDevice }
        try p.run()
        process = p
        stdin = input
        // READY {"port": N}, within 30 s.
        let reader = output.fileHandleForReading
        let line = try await withThrowingTaskGroup(of: String.self) { group in
            group.addTask {
                var bytes: [UInt8] = []
                while true {
                    let chunk = reader.availableData
                    if chunk.isEmpty { throw FakeError("the fake providers exited before READY") }
                    bytes += chunk
                    if let nl = bytes.firstIndex(of: 0x0A) { return String(decoding: bytes[..<nl], as: UTF8.self) }
                }
            }
            group.addTask {
                try await Task.sleep(for: .seconds(30))
                throw FakeError("the fake providers did not print READY in 30 s")
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
        guard line.hasPrefix("READY "), let json = try JSONSerialization.jsonObject(with: Data(line.dropFirst(6).utf8)) as? [String: Any],
            let port = json["port"] as? Int
        else {
            p.terminate()
            throw FakeError("unexpected first line from the fake providers: \(line)")
        }
        self.port = port
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.additionalTrustRoots = [.file(directory + "/ca.pem")]
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: tls))
    }

    struct FakeError: Error, CustomStringConvertible {
        var description: String
        init(_ d: String) { description = d }
    }

    var base: String { "https://127.0.0.1:\(port)" }
    var caFile: String { directory + "/ca.pem" }

    /// Settings that point every provider of social at this server.
    func settings(apns: Bool = true, fcm: Bool = true, webPush: Bool = true, timeout: Duration = .seconds(5)) throws -> PushSettings {
        var s = PushSettings()
        if apns {
            let ids =
                try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: directory + "/apns.json"))) as? [String: String] ?? [:]
            var a = PushSettings.APNs(keyFile: directory + "/apns-key.p8", keyID: ids["key_id"] ?? "", teamID: ids["team_id"] ?? "")
            a.productionURL = base
            a.sandboxURL = base
            s.apns = a
        }
        if fcm {
            var f = PushSettings.FCM(serviceAccountFile: directory + "/fcm-service-account.json")
            f.baseURL = base
            s.fcm = f
        }
        if webPush { s.webPush = .init(vapidKeyFile: directory + "/vapid-private.pem", subject: "mailto:ops@example.com") }
        s.trustRootsFile = caFile
        s.allowPrivateEndpoints = true
        s.requestTimeout = timeout
        return s
    }

    func request(_ method: HTTPMethod, _ path: String, _ body: [String: Any]? = nil) async throws -> Any {
        var r = HTTPClientRequest(url: base + path)
        r.method = method
        if let body {
            r.headers.add(name: "content-type", value: "application/json")
            r.body = .bytes(ByteBuffer(bytes: Array(try JSONSerialization.data(withJSONObject: body))))
        }
        let response = try await client.execute(r, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 16 << 20)
        guard (200..<300).contains(Int(response.status.code)) else {
            throw FakeError("\(method) \(path): \(response.status) \(String(buffer: bytes))")
        }
        if bytes.readableBytes == 0 { return [String: Any]() }
        return try JSONSerialization.jsonObject(with: Data(bytes.readableBytesView))
    }

    /// Accepted pushes, in arrival order (`provider` filters).
    func received(_ provider: String? = nil) async throws -> [[String: Any]] {
        try await request(.GET, "/control/received" + (provider.map { "?provider=\($0)" } ?? "")) as? [[String: Any]] ?? []
    }
    func rejected() async throws -> [[String: Any]] { try await request(.GET, "/control/rejected") as? [[String: Any]] ?? [] }
    func scripted(_ provider: String? = nil) async throws -> [[String: Any]] {
        try await request(.GET, "/control/scripted" + (provider.map { "?provider=\($0)" } ?? "")) as? [[String: Any]] ?? []
    }
    func script(_ script: [String: Any]) async throws { _ = try await request(.POST, "/control/script", script) }
    func reset() async throws { _ = try await request(.POST, "/control/reset", [:]) }
    func stats() async throws -> [String: Any] { try await request(.GET, "/control/stats") as? [String: Any] ?? [:] }

    /// A new Web Push subscription: (id, endpoint, p256dh, auth).
    func subscription() async throws -> (id: String, endpoint: String, p256dh: String, auth: String) {
        let s = try await request(.POST, "/control/webpush/subscriptions", [:]) as? [String: Any] ?? [:]
        return (s["id"] as? String ?? "", s["endpoint"] as? String ?? "", s["p256dh"] as? String ?? "", s["auth"] as? String ?? "")
    }
    func deleteSubscription(_ id: String) async throws { _ = try await request(.DELETE, "/control/webpush/subscriptions/\(id)") }

    func stop() async {
        try? stdin.fileHandleForWriting.close()
        process.terminate()
        process.waitUntilExit()
        try? await client.shutdown()
    }
}

/// Runs `body` with a fresh fake provider server (in a temporary folder) and always stops it.
func withFakeProviders(_ body: (FakePushProviders) async throws -> Void) async throws {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fake-push-\(UUID().uuidString)").path
    let fake = try await FakePushProviders(directory: dir)
    do { try await body(fake) } catch {
        await fake.stop()
        try? FileManager.default.removeItem(atPath: dir)
        throw error
    }
    await fake.stop()
    try? FileManager.default.removeItem(atPath: dir)
}
