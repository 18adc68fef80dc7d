import Accounts
import Contracts
import Foundation
import Logging
import RPCCore
import RPCServices
import RPCTransport
import Security
import ServiceKit
import Storage
import Synchronization
import Testing

/// The service credential of the in-process test servers.
let testServiceToken = "test-service-token-0123456789"
/// The gateway's credential the in-process test servers recognise (relayed user calls).
let testGatewayToken = "test-gateway-token-0123456789"

/// Every log line of a test server, so tests can check that no secret is ever logged.
final class CapturedLogs: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}

struct CapturingLogHandler: LogHandler {
    let sink: CapturedLogs
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        sink.append("\(event.level) \(event.message) \(all.map { "\($0)=\($1)" }.sorted().joined(separator: " "))")
    }
}

/// An accounts server on 127.0.0.1:0 in this process, reached through real gRPC (our HTTP/2
/// client over loopback), on a fresh data directory; `stop()` shuts it down and removes the data.
final class TestAccounts: Sendable {
    let directory: String
    let core: AccountsCore
    let server: RPCServer
    let port: Int
    let channel: RPCChannel
    let logs: CapturedLogs
    let jobs: Task<Void, Never>

    var accounts: Accounts_V1_AccountsClient { Accounts_V1_AccountsClient(channel.client) }
    /// The internal API with the service credential.
    var internalAPI: Accounts_V1_AccountsInternalClient {
        Accounts_V1_AccountsInternalClient(RPCClient(transport: CredentialedTransport(base: channel, serviceToken: testServiceToken)))
    }

    /// Fast settings: a cheap scrypt cost (the default is the strong one).
    static func testConfiguration(_ directory: String) -> AccountsConfiguration {
        var c = AccountsConfiguration(dataDirectory: directory)
        c.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        return c
    }

    private init(directory: String, core: AccountsCore, server: RPCServer, port: Int, logs: CapturedLogs, jobs: Task<Void, Never>) {
        self.directory = directory
        self.core = core
        self.server = server
        self.port = port
        self.logs = logs
        self.jobs = jobs
        // Our client opens its receive window per complete message too: it must exceed the
        // largest response (a 1 MiB avatar).
        var channelConfig = ChannelConfiguration(host: "127.0.0.1", port: port)
        channelConfig.initialWindowSize = 4 << 20
        channel = RPCChannel(configuration: channelConfig)
    }

    /// `directory`: an earlier server's data (a restart); a fresh one when nil.
    static func start(
        background: Bool = true, directory: String? = nil,
        _ configure: (inout AccountsConfiguration) -> Void = { _ in }
    ) async throws -> TestAccounts {
        let directory = directory ?? FileManager.default.temporaryDirectory.appendingPathComponent("accounts-tests-\(UUID().uuidString)").path
        var configuration = testConfiguration(directory)
        configure(&configuration)
        let logs = CapturedLogs()
        let logger = Logger(label: "accounts-test") { _ in CapturingLogHandler(sink: logs) }
        let core = try AccountsCore(configuration: configuration, logger: logger)
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.maxReceiveMessageSize = configuration.maxRequestBytes
        config.interceptors = [AuthInterceptor(keys: core.signingKeySource, serviceToken: testServiceToken, gatewayToken: testGatewayToken)]
        let (_, services) = StandardServices.make(for: core.services, descriptors: ContractsDescriptors.descriptorSet)
        let server = RPCServer(configuration: config, services: services, logger: logger)
        let port = try await server.start()
        // Only the reset mailer: deletion delivery is tested with its own deliverer.
        let jobs = Task { if background { await core.runResetMails() } }
        return TestAccounts(directory: directory, core: core, server: server, port: port, logs: logs, jobs: jobs)
    }

    /// Stops the server; `keepingData` leaves the data directory for a restart.
    func stop(keepingData: Bool = false) async {
        jobs.cancel()
        await channel.close()
        await server.shutdownGracefully()
        _ = await jobs.value
        core.close()
        if !keepingData { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// Runs `body` against a fresh in-process server and always stops it.
func withAccounts(
    _ configure: (inout AccountsConfiguration) -> Void = { _ in },
    _ body: (TestAccounts) async throws -> Void
) async throws {
    let env = try await TestAccounts.start(configure)
    do {
        try await body(env)
    } catch {
        await env.stop()
        throw error
    }
    await env.stop()
}

/// Call options carrying an access token.
func bearer(_ token: String) -> CallOptions {
    CallOptions(timeout: .seconds(20), metadata: Metadata([("authorization", "Bearer \(token)")]))
}

func bearer(_ session: Accounts_V1_Session) -> CallOptions { bearer(session.accessToken) }

// MARK: Requests

let counter = Mutex(0)

/// A unique, valid username ("u" + short random).
func uniqueName(_ prefix: String = "user") -> String {
    "\(prefix)\(counter.withLock { $0 += 1; return $0 })_\(SecureRandom.token(bytes: 3).lowercased().filter { $0.isLetter || $0.isNumber })"
}

func signUpRequest(
    _ username: String, email: String? = nil, password: String = "correct horse battery staple",
    displayName: String = "", contact: Accounts_V1_ContactInfo? = nil
) -> Accounts_V1_SignUpRequest {
    var r = Accounts_V1_SignUpRequest()
    r.username = username
    r.email = email ?? "\(username)@example.com"
    r.password = password
    r.displayName = displayName
    if let contact { r.contactInfo = contact }
    return r
}

func logInRequest(username: String? = nil, email: String? = nil, password: String) -> Accounts_V1_LogInRequest {
    var r = Accounts_V1_LogInRequest()
    if let username { r.username = username }
    if let email { r.email = email }
    r.password = password
    return r
}

extension TestAccounts {
    @discardableResult
    func signUp(
        _ username: String = uniqueName(), email: String? = nil, password: String = "correct horse battery staple",
        displayName: String = "", contact: Accounts_V1_ContactInfo? = nil
    ) async throws -> Accounts_V1_SignUpResponse {
        try await accounts.signUp(signUpRequest(username, email: email, password: password, displayName: displayName, contact: contact))
    }

    func logIn(_ username: String, _ password: String = "correct horse battery staple") async throws -> Accounts_V1_LogInResponse {
        try await accounts.logIn(logInRequest(username: username, password: password))
    }

    /// Waits for a mail to `email` of `kind` (reset mails are sent in the background).
    func waitForMail(
        to email: String, kind: Accounts_V1_MailKind = .passwordReset, count: Int = 1,
        timeout: Duration = .seconds(10)
    ) async throws -> [Accounts_V1_Mail] {
        let deadline = ContinuousClock.now + timeout
        while true {
            var r = Accounts_V1_ListSentMailRequest()
            r.toEmail = email
            r.kind = kind
            r.pageSize = 100
            let mails = try await internalAPI.listSentMail(r).mails
            if mails.count >= count { return mails }
            if ContinuousClock.now > deadline { return mails }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

// MARK: Errors

/// What a failed call said: status, message, BadRequest fields, RetryInfo delay.
struct CallFailure {
    var code: StatusCode
    var message: String
    var fields: [String]
    var retryDelaySeconds: Int64?
    var trailers: Metadata
}

extension RPCError {
    var failure: CallFailure {
        var fields: [String] = []
        var retry: Int64?
        if let bytes = trailers.binary("grpc-status-details-bin"), let status = try? Google_Rpc_Status(serializedBytes: bytes) {
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

/// Runs `body`, expects it to fail with `code`, and returns what the failure said.
@discardableResult
func expectFailure<T>(
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

/// The smallest valid images of each format (magic bytes are what counts).
enum Images {
    static let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + Array(repeating: 0, count: 32)
    static let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF, 0xE0] + Array(repeating: 0, count: 32)
    static let webp: [UInt8] = Array("RIFF".utf8) + [0x24, 0, 0, 0] + Array("WEBPVP8 ".utf8) + Array(repeating: 0, count: 24)
}

/// A file next to the test binary (the executables SwiftPM built with the tests).
func builtProduct(_ name: String) -> String {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
    while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
    return dir.appendingPathComponent(name).path
}
