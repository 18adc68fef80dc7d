import Contracts
import Foundation
import Logging
import Observability
import RPCCore
import RPCServices
import RPCTLS
import RPCTransport
import Security
import ServiceKit
import Synchronization
import Testing

// What every service's tests need (a library for test targets only): token keys and tokens, an
// in-process server with the kit's access policy on loopback, clients as each kind of caller, and
// the details of a failed call. Real gRPC on loopback, real storage files.

/// Credentials of the in-process test servers (long enough to pass the kit's production check).
public enum TestCredentials {
    public static let serviceToken = "test-service-credential-0123456789abcdef"
    public static let gatewayToken = "test-gateway-credential-0123456789abcdef"
}

/// A token key pair standing in for accounts' signing key, and access tokens it signs.
public final class TestTokens: Sendable {
    public let pair = Ed25519KeyPair()
    public let keyID: String
    public init(keyID: String = "test-key-1") { self.keyID = keyID }

    /// An access token for `user` (a fresh session id unless given), valid `expiresIn` seconds.
    public func token(user: String, session: String? = nil, expiresIn: Int64 = 900, guest: Bool = false) -> String {
        let now = AccessToken.currentTime()
        let claims = AccessTokenClaims(
            userID: user, sessionID: session ?? "s-\(user)", expiresAt: now + expiresIn,
            issuedAt: min(now, now + expiresIn - 1), keyID: keyID, kind: guest ? .guest : .user)
        return AccessToken.sign(claims, with: pair)
    }

    /// The keys a service verifies with.
    public var source: StaticSigningKeys {
        let id = keyID, key = pair.publicKey
        return StaticSigningKeys { [id: key] }
    }
}

/// A service's RPC services on 127.0.0.1:0 in this process, behind the kit's access policy, with
/// health and reflection, reached through real gRPC (our HTTP/2 client over loopback).
public final class TestServer: Sendable {
    public let server: RPCServer
    public let port: Int
    public let channel: RPCChannel

    /// - Parameter keys: the token keys the policy verifies with (`TestTokens.source`, or a real
    ///   accounts' `signingKeySource`).
    public init(
        services: [any RPCService], keys: any SigningKeySource, logger: Logger = Logger(label: "test-server"),
        configure: (inout ServerConfiguration) -> Void = { _ in }
    ) async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.interceptors = [
            AuthInterceptor(
                keys: keys, serviceToken: TestCredentials.serviceToken,
                gatewayToken: TestCredentials.gatewayToken)
        ]
        ServiceHost.addMetrics(to: &config)
        configure(&config)
        let (_, all) = StandardServices.make(for: services, descriptors: ContractsDescriptors.descriptorSet)
        server = RPCServer(configuration: config, services: all, logger: logger)
        port = try await server.start()
        var channelConfig = ChannelConfiguration(host: "127.0.0.1", port: port)
        channelConfig.initialWindowSize = 8 << 20
        channel = RPCChannel(configuration: channelConfig)
    }

    /// A caller without credentials (a client calling the service directly).
    public var anonymous: RPCClient { channel.client }
    /// Another service: the service credential.
    public var service: RPCClient { RPCClient(transport: CredentialedTransport(base: channel, serviceToken: TestCredentials.serviceToken)) }
    /// The gateway relaying a user's call: the gateway credential.
    public var gateway: RPCClient { RPCClient(transport: CredentialedTransport(base: channel, gatewayToken: TestCredentials.gatewayToken)) }

    /// A client for another port with the service credential (a peer of the service under test).
    public static func peerClient(port: Int) -> RPCClient {
        RPCClient(transport: CredentialedTransport(base: RPCChannel(host: "127.0.0.1", port: port), serviceToken: TestCredentials.serviceToken))
    }

    public func stop() async {
        await channel.close()
        await server.shutdownGracefully()
    }
}

/// Call options carrying `token` as the bearer (and a generous deadline).
public func bearer(_ token: String, timeout: Duration = .seconds(20)) -> CallOptions {
    CallOptions(timeout: timeout, metadata: Metadata([("authorization", "Bearer \(token)")]))
}

/// A fresh directory under the system's temporary directory; `remove()` deletes it.
public struct TemporaryDirectory: Sendable {
    public let path: String
    public init(_ prefix: String = "kit-test") {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    public func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// A TCP socket bound to a free port on 127.0.0.1, listening when `backlog` is given (else only
/// bound: a connection to it is refused, and no other socket can take the port). The caller
/// closes `fd`.
public func loopbackSocket(listening backlog: Int32? = nil) throws -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EMFILE) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
    let named = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    guard bound == 0, named == 0, backlog.map({ listen(fd, $0) == 0 }) ?? true else {
        close(fd)
        throw POSIXError(.EADDRINUSE)
    }
    return (fd, Int(UInt16(bigEndian: addr.sin_port)))
}

/// A span file in a directory of its own, and a tracer recording every new trace into it (tests
/// of tracing). `remove()` deletes the directory.
public struct TestSpanFile: Sendable {
    public let dir: TemporaryDirectory
    public let path: String
    public let exporter: SpanFileExporter
    public let tracer: SpanTracer

    /// `ratio`: of new traces, how many are sampled (all, by default). `notesCalls`: as a process
    /// that writes an access log (a gateway that writes none relays the calls it does not trace).
    public init(serviceName: String, fileName: String = "spans.jsonl", ratio: Double = 1, notesCalls: Bool = true) throws {
        dir = TemporaryDirectory()
        path = "\(dir.path)/\(fileName)"
        exporter = try SpanFileExporter(path: path, serviceName: serviceName)
        tracer = SpanTracer(serviceName: serviceName, sampler: RatioSampler(ratio: ratio), exporter: exporter, notesCalls: notesCalls)
    }

    public func remove() { dir.remove() }
}

/// Reads a span file: one JSON object per line.
public func readSpans(_ path: String) throws -> [[String: Any]] {
    let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    return try text.split(separator: "\n").map { line in
        try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }
}

/// A span's attributes by key (each value as the file has it: strings, and integers as strings).
public func attributes(_ span: [String: Any]) -> [String: Any] {
    var out: [String: Any] = [:]
    for a in span["attributes"] as? [[String: Any]] ?? [] {
        guard let key = a["key"] as? String, let value = a["value"] as? [String: Any], let v = value.values.first else { continue }
        out[key] = v
    }
    return out
}

// MARK: Failed calls

/// What a failed call said: status, message, BadRequest fields, RetryInfo delay, trailers.
public struct CallFailure: Sendable {
    public var code: StatusCode
    public var message: String
    public var fields: [String]
    public var retryDelaySeconds: Int64?
    public var trailers: Metadata
}

extension RPCError {
    /// The details of this error as a client decodes them (`grpc-status-details-bin`).
    public var failure: CallFailure {
        var fields: [String] = []
        var retry: Int64?
        let detailBytes = details ?? trailers.binary("grpc-status-details-bin")
        if let bytes = detailBytes, let status = try? Google_Rpc_Status(serializedBytes: bytes) {
            for any in status.details {
                if any.typeUrl.hasSuffix("google.rpc.BadRequest"), let bad = try? Google_Rpc_BadRequest(serializedBytes: any.value) {
                    fields += bad.fieldViolations.map(\.field)
                }
                if any.typeUrl.hasSuffix("google.rpc.RetryInfo"), let info = try? Google_Rpc_RetryInfo(serializedBytes: any.value) {
                    retry = info.retryDelay.seconds
                }
            }
        }
        return CallFailure(code: code, message: message, fields: fields, retryDelaySeconds: retry, trailers: trailers)
    }
}

/// Runs `body`, expects it to fail with `code` (and, when given, exactly the BadRequest `fields`),
/// and returns what the failure said.
@discardableResult
public func expectFailure<T>(
    _ code: StatusCode, fields: [String]? = nil, _ comment: Comment? = nil,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> T
) async -> CallFailure? {
    do {
        _ = try await body()
        Issue.record("expected \(code.name), the call succeeded. \(comment?.description ?? "")", sourceLocation: sourceLocation)
        return nil
    } catch let error as RPCError {
        let f = error.failure
        #expect(f.code == code, "got \(error). \(comment?.description ?? "")", sourceLocation: sourceLocation)
        if let fields { #expect(Set(f.fields) == Set(fields), "BadRequest fields of \(error)", sourceLocation: sourceLocation) }
        return f
    } catch {
        Issue.record("expected an RPCError \(code.name), got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes (for effects that happen in
/// the background: outbox deliveries, live pushes); returns whether it held.
@discardableResult
public func eventually(timeout: Duration = .seconds(10), _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return try await condition()
}

// MARK: Certificates

/// A development cluster CA and certificates it signs, made at test time in a temporary
/// directory (mutual TLS between services): `<name>.pem` and `<name>-key.pem` for each of
/// `names`, signed by `ca.pem`; and for each of `foreign`, the same signed by another CA
/// (`other-ca.pem`), which the cluster does not trust. Every certificate is valid for its name,
/// `localhost` and `127.0.0.1`, as a server and as a client.
public struct TestCertificates: Sendable {
    public let directory: String
    public var caFile: String { "\(directory)/ca.pem" }
    public var otherCAFile: String { "\(directory)/other-ca.pem" }

    public init(names: [String] = ["accounts", "social", "tasks", "gateway", "client"], foreign: [String] = ["rogue"]) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("certs-\(UUID().uuidString)").path
        let ca = try DevelopmentCertificate.generateAuthority(commonName: "test cluster CA", directory: directory)
        let other = try DevelopmentCertificate.generateAuthority(commonName: "another CA", directory: directory, fileName: "other-ca")
        for name in names { _ = try DevelopmentCertificate.generate(commonName: name, directory: directory, issuer: ca, fileName: name) }
        for name in foreign { _ = try DevelopmentCertificate.generate(commonName: name, directory: directory, issuer: other, fileName: name) }
    }

    public func certFile(_ name: String) -> String { "\(directory)/\(name).pem" }
    public func keyFile(_ name: String) -> String { "\(directory)/\(name)-key.pem" }

    /// `PEER_TLS_CA`, and `PEER_TLS_CERT`/`PEER_TLS_KEY` of `name` when given: a process's
    /// settings for TLS towards its peers.
    public func peerEnvironment(as name: String?) -> [String: String] {
        var env = ["PEER_TLS_CA": caFile]
        if let name {
            env["PEER_TLS_CERT"] = certFile(name)
            env["PEER_TLS_KEY"] = keyFile(name)
        }
        return env
    }

    /// `--tls-cert`, `--tls-key` of `name`, and `--tls-client-ca` when `mutual`: a process's
    /// flags to serve TLS (requiring client certificates from the cluster CA).
    public func serverArguments(_ name: String, mutual: Bool) -> [String] {
        ["--tls-cert", certFile(name), "--tls-key", keyFile(name)] + (mutual ? ["--tls-client-ca", caFile] : [])
    }

    /// A client TLS configuration trusting the cluster CA, presenting `name`'s certificate.
    public func client(as name: String?, serverName: String? = nil) throws -> TLSConfiguration {
        try TLSConfiguration.client(
            alpn: ["h2"], trustRootsPEMFile: caFile, serverName: serverName, certificateChainPEMFile: name.map(certFile),
            privateKeyPEMFile: name.map(keyFile))
    }

    public func remove() { try? FileManager.default.removeItem(atPath: directory) }
}
