import Accounts
import ContractTesting
import Contracts
import Foundation
import GRPCContracts
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Synchronization
import Testing

@testable import Matchmaking

/// The real `matchmaking-service` executable as a child process under `timeout -s KILL` (it stops
/// by itself even if the test runner dies), started through `posix_spawn` (ContractTesting's
/// `Subprocess`), with the real accounts in this process as its token issuer.
final class MatchmakingProcess: @unchecked Sendable {
    let dataDir: String
    let logPath: String
    let spawned: pid_t
    private let exit = Mutex<Int32?>(nil)
    private(set) var pid: Int32?

    init(dataDir: String, accountsPort: Int) throws {
        self.dataDir = dataDir
        try? FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        logPath = dataDir + "-\(UUID().uuidString.prefix(8)).log"
        let env = [
            "SERVICE_TOKEN": TestCredentials.serviceToken, "GATEWAY_TOKEN": TestCredentials.gatewayToken,
            "ACCOUNTS_ADDR": "127.0.0.1:\(accountsPort)", "SOCIAL_ADDR": "127.0.0.1:\(closedPort())", "LOG_LEVEL": "info",
        ]
        spawned = try Subprocess.spawn(
            "/usr/bin/env",
            env.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" } + [
                "/usr/bin/timeout", "-s", "KILL", "300", Self.builtProduct("matchmaking-service"), "--host", "127.0.0.1", "--port", "0",
                "--data-dir", dataDir,
            ], stdinPath: "/dev/null", stdoutPath: logPath, stderrPath: logPath)
    }

    static func builtProduct(_ name: String) -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
        return dir.appendingPathComponent(name).path
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    var isRunning: Bool {
        if exit.withLock({ $0 }) != nil { return false }
        var status: Int32 = 0
        let r = waitpid(spawned, &status, WNOHANG)
        guard r == spawned else { return r == 0 }
        let signal = status & 0x7f
        exit.withLock { $0 = signal == 0 ? (status >> 8) & 0xff : 128 + signal }
        return false
    }

    func waitUntilListening(timeout: Duration = .seconds(60)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let text = log
            if let range = text.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                pid = (try? String(contentsOfFile: "\(dataDir)/\(MatchmakingSchema.fileName).lock", encoding: .utf8)).flatMap {
                    Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
                }
                let match = text[range]
                return Int(match[match.index(after: match.lastIndex(of: ":")!)...])!
            }
            if !isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "matchmaking-service did not start:\n\(log)")
    }

    func signal(_ sig: Int32) { if let pid, isRunning, pid != getpid() { kill(pid, sig) } }

    func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return exit.withLock { $0 }
    }

    func forceStop() {
        signal(SIGKILL)
        if isRunning { kill(spawned, SIGTERM) }
        _ = isRunning
        try? FileManager.default.removeItem(atPath: logPath)
    }
}

@Suite("matchmaking-service: the executable", .serialized)
struct ProcessTests {
    @Test func servesPlaysAndShutsDownGracefullyEndingStreamsThenKeepsItsData() async throws {
        let dir = TemporaryDirectory("mm-proc")
        defer { dir.remove() }
        var ac = AccountsConfiguration(dataDirectory: dir.path + "/accounts")
        ac.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        let quiet = Logger(label: "accounts") { _ in SwiftLogNoOpLogHandler() }
        let accounts = try AccountsCore(configuration: ac, logger: quiet)
        let accountsServer = try await TestServer(services: accounts.services, keys: accounts.signingKeySource, logger: quiet)
        defer { accounts.close() }
        var signUp = Accounts_V1_SignUpRequest()
        signUp.username = uniqueName("proc")
        signUp.email = "\(signUp.username)@example.com"
        signUp.password = "correct horse battery staple"
        let token = try await Accounts_V1_AccountsClient(accountsServer.anonymous).signUp(signUp).session.accessToken

        let service = try MatchmakingProcess(dataDir: dir.path + "/mm", accountsPort: accountsServer.port)
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let health = Grpc_Health_V1_HealthClient(channel.client)
        for name in ["", "matchmaking.v1.Matchmaking", "matchmaking.v1.MatchmakingInternal"] {
            var check = Grpc_Health_V1_HealthCheckRequest()
            check.service = name
            #expect(try await health.check(check).status == .serving, "\(name)")
        }
        // Credentials: a user's token directly (not through the gateway) is refused at the door.
        let direct = Matchmaking_V1_MatchmakingClient(channel.client)
        await expectFailure(.unauthenticated) { try await direct.getLeaderboard(Matchmaking_V1_GetLeaderboardRequest()) }
        let mm = Matchmaking_V1_MatchmakingClient(
            RPCClient(transport: CredentialedTransport(base: channel, gatewayToken: TestCredentials.gatewayToken)))
        var start = Matchmaking_V1_StartLocalMatchRequest()
        start.idempotencyKey = "proc-1"
        let m = try await mm.startLocalMatch(start, options: bearer(token)).match
        let moved = try await mm.submitMove(MatchEnv.legalMove(m), options: bearer(token)).match
        #expect(moved.turnNumber == 2)

        // A watcher is ended with UNAVAILABLE by SIGTERM (resume with after_sequence); exit 0.
        let ended = Mutex<RPCError?>(nil)
        let got = Mutex(0)
        var w = Matchmaking_V1_WatchMatchRequest()
        w.matchId = m.matchId
        let watch = Task {
            do {
                try await mm.watchMatch(w, options: bearer(token, timeout: .seconds(60))) { s in
                    for try await _ in s.messages { got.withLock { $0 += 1 } }
                }
            } catch let e as RPCError { ended.withLock { $0 = e } } catch {}
        }
        #expect(await eventually { got.withLock { $0 } >= 1 })
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)
        _ = await watch.value
        #expect(ended.withLock { $0 }?.code == .unavailable)
        await channel.close()

        // Restarted on the same data: the match and its move are there.
        let again = try MatchmakingProcess(dataDir: dir.path + "/mm", accountsPort: accountsServer.port)
        defer { again.forceStop() }
        let port2 = try await again.waitUntilListening()
        let channel2 = RPCChannel(host: "127.0.0.1", port: port2)
        let mm2 = Matchmaking_V1_MatchmakingClient(
            RPCClient(transport: CredentialedTransport(base: channel2, gatewayToken: TestCredentials.gatewayToken)))
        var get = Matchmaking_V1_GetMatchRequest()
        get.matchId = m.matchId
        #expect(try await mm2.getMatch(get, options: bearer(token)).match.turnNumber == 2)
        #expect(try await mm2.startLocalMatch(start, options: bearer(token)).replayed)
        again.signal(SIGTERM)
        #expect(await again.waitForExit() == 0)
        await channel2.close()
        await accountsServer.stop()
    }
}
