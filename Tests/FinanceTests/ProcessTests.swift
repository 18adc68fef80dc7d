import Contracts
import Finance
import Foundation
import RPCCore
import RPCTransport
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

/// Lines of output collected from a child process.
final class Lines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ s: String) { lines.withLock { $0.append(s) } }
    var all: [String] { lines.withLock { $0 } }
}

/// The real `finance-service` executable as a child process under `timeout -s KILL`, so it stops
/// by itself even if the test runner dies; its peers are the test's accounts and social double.
final class FinanceProcess: @unchecked Sendable {
    let process = Process()
    let dataDir: String
    private let output = Lines()
    private(set) var pid: Int32?

    init(dataDir: String, env: FinanceEnv, arguments: [String]? = nil, environment: [String: String] = [:]) throws {
        self.dataDir = dataDir
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments =
            ["-s", "KILL", "300", builtProduct("finance-service")]
            + (arguments ?? ["--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir])
        var e = ProcessInfo.processInfo.environment
        e["SERVICE_TOKEN"] = TestCredentials.serviceToken
        e["GATEWAY_TOKEN"] = TestCredentials.gatewayToken
        e["ALLOW_DEV_CREDENTIALS"] = "1"
        e["DATA_DIR"] = dataDir
        e["ACCOUNTS_ADDR"] = "127.0.0.1:\(env.accounts.port)"
        e["SOCIAL_ADDR"] = "127.0.0.1:\(env.socialPort)"
        e["LOG_LEVEL"] = "info"
        for (k, v) in environment { e[k] = v }
        process.environment = e
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = pipe
        let output = self.output
        pipe.fileHandleForReading.readabilityHandler = { h in
            let data = h.availableData
            if !data.isEmpty { output.append(String(decoding: data, as: UTF8.self)) }
        }
        try process.run()
    }

    var log: String { output.all.joined() }

    func waitUntilListening(timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let range = log.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let text = log[range]
                pid = (try? String(contentsOfFile: "\(dataDir)/finance.sqlite.lock", encoding: .utf8))
                    .flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                return Int(text[text.index(after: text.lastIndex(of: ":")!)...])!
            }
            if !process.isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "finance-service did not start:\n\(log)")
    }

    func signal(_ sig: Int32) { if let pid, process.isRunning, pid != getpid() { kill(pid, sig) } }

    func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    func forceStop() {
        signal(SIGKILL)
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
    }
}

/// A charge sent during the crash test, with the id it was acknowledged with (nil: no answer).
struct Sent: Sendable {
    var caller: Int
    var request: Finance_V1_CreateChargeRequest
    var id: String?
}

final class SentLog: Sendable {
    private let items = Mutex<[Sent]>([])
    func append(_ s: Sent) { items.withLock { $0.append(s) } }
    var all: [Sent] { items.withLock { $0 } }
}

@Suite("finance-service: the executable", .serialized)
struct ProcessTests {
    @Test func servesHealthReflectionMoneyAndShutsDownGracefully() async throws {
        try await withFinance { env in
            let dir = TemporaryDirectory("finance-proc")
            defer { dir.remove() }
            let service = try FinanceProcess(dataDir: dir.path, env: env)
            defer { service.forceStop() }
            let port = try await service.waitUntilListening()
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            let health = Grpc_Health_V1_HealthClient(channel.client)
            for name in ["", "finance.v1.Finance", "finance.v1.FinanceInternal"] {
                var check = Grpc_Health_V1_HealthCheckRequest()
                check.service = name
                #expect(try await health.check(check).status == .serving, "\(name)")
            }
            let services = try await Grpc_Reflection_V1_ServerReflectionClient(channel.client).serverReflectionInfo { writer, responses in
                var request = Grpc_Reflection_V1_ServerReflectionRequest()
                request.listServices = ""
                try await writer.write(request)
                for try await response in responses.messages { return response.listServicesResponse.service.map(\.name) }
                return []
            }
            #expect(Set(services).isSuperset(of: ["finance.v1.Finance", "finance.v1.FinanceInternal", "grpc.health.v1.Health"]))

            // Money through the real process: tokens checked with accounts' keys, membership with social.
            let (a, b) = (try await env.user(), try await env.user())
            let h = env.household([a, b])
            let finance = Finance_V1_FinanceClient(channel.client)
            let t = try await finance.createCharge(chargeRequest(h, 1000, among: [b]), options: a.options).transaction
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            #expect(try await finance.getBalances(r, options: b.options).balances.map(\.amount.amountCents) == [-1000])
            // Its outbox reaches social.
            #expect(await eventually { env.social.received.contains { $0.eventId == "finance:\(t.transactionId)" } })
            // Internal RPCs need the service credential.
            await expectFailure(.permissionDenied) {
                try await Finance_V1_FinanceInternalClient(
                    RPCClient(transport: CredentialedTransport(base: channel, gatewayToken: TestCredentials.gatewayToken))
                )
                .verifyLedger(Finance_V1_VerifyLedgerRequest())
            }
            await channel.close()
            service.signal(SIGTERM)
            #expect(await service.waitForExit() == 0)
            #expect(service.log.contains("shutting down gracefully"))

            // The operator's verification of the stopped service's data.
            let verify = try FinanceProcess(dataDir: dir.path, env: env, arguments: ["--verify-ledgers", "--data-dir", dir.path])
            #expect(await verify.waitForExit() == 0)
            #expect(verify.log.contains("household \(h): verified, 1 entries"), "\(verify.log)")
        }
    }

    @Test func settingsComeFromTheEnvironmentAndBadOnesRefuseTheStart() async throws {
        try await withFinance { env in
            let dir = TemporaryDirectory("finance-proc")
            defer { dir.remove() }
            let bad = try FinanceProcess(dataDir: dir.path, env: env, environment: ["FINANCE_MEMBERSHIP_TIMEOUT_MS": "soon"])
            defer { bad.forceStop() }
            let status = await bad.waitForExit()
            #expect(status != nil && status != 0)
            #expect(bad.log.contains("FINANCE_MEMBERSHIP_TIMEOUT_MS"), "\(bad.log)")

            // A short membership deadline: a slow social is cut off at it.
            let service = try FinanceProcess(dataDir: dir.path, env: env, environment: ["FINANCE_MEMBERSHIP_TIMEOUT_MS": "200"])
            defer { service.forceStop() }
            let port = try await service.waitUntilListening()
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            let (a, b) = (try await env.user(), try await env.user())
            let h = env.household([a, b])
            env.social.delay.withLock { $0 = .seconds(2) }
            let started = ContinuousClock.now
            await expectFailure(.unavailable) {
                try await Finance_V1_FinanceClient(channel.client).createCharge(chargeRequest(h, 100, among: [b]), options: a.options)
            }
            #expect(ContinuousClock.now - started < .milliseconds(1500))
            env.social.delay.withLock { $0 = .zero }
            await channel.close()
            service.signal(SIGTERM)
            #expect(await service.waitForExit() == 0)
        }
    }

    /// kill -9 during a burst of charges from several clients: after a restart every acknowledged
    /// charge is there exactly once (a retry with its key replays it), every balance equals its
    /// history, `PRAGMA integrity_check` is ok and the hash chains verify.
    @Test func killedDuringABurstOfChargesLosesNothingAndDuplicatesNothing() async throws {
        try await withFinance { env in
            let dir = TemporaryDirectory("finance-crash")
            defer { dir.remove() }
            let users = try await (0..<5).asyncMap { _ in try await env.user() }
            let h = env.household(users)
            let service = try FinanceProcess(dataDir: dir.path, env: env)
            defer { service.forceStop() }
            let port = try await service.waitUntilListening()

            let acknowledged = SentLog(), unacknowledged = SentLog()
            let burst = Task {
                await withTaskGroup(of: Void.self) { group in
                    for worker in 0..<8 {
                        group.addTask {
                            // Each client its own connection.
                            let channel = RPCChannel(host: "127.0.0.1", port: port)
                            defer { Task { await channel.close() } }
                            let client = Finance_V1_FinanceClient(channel.client)
                            var i = 0
                            while !Task.isCancelled {
                                i += 1
                                let caller = (worker + i) % users.count
                                let others = users.indices.filter { $0 != caller }.map { users[$0] }
                                let request = chargeRequest(
                                    h, Int64(100 + (worker * 7919 + i * 31) % 5000), among: Array(others.prefix(1 + i % 4)),
                                    key: "crash-\(worker)-\(i)")
                                do {
                                    let r = try await client.createCharge(
                                        request,
                                        options: CallOptions(
                                            timeout: .seconds(5),
                                            metadata: Metadata([("authorization", "Bearer \(users[caller].token)")])))
                                    acknowledged.append(Sent(caller: caller, request: request, id: r.transaction.transactionId))
                                } catch {
                                    unacknowledged.append(Sent(caller: caller, request: request, id: nil))
                                    return  // the server is gone
                                }
                            }
                        }
                    }
                }
            }
            let deadline = ContinuousClock.now + .seconds(30)
            while acknowledged.all.count < 300 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
            service.signal(SIGKILL)
            let status = await service.waitForExit()
            #expect(status == 137 || status == 9, "exit status \(String(describing: status))")
            burst.cancel()
            await burst.value
            let acked = acknowledged.all
            let inFlight = unacknowledged.all
            #expect(acked.count >= 300)

            // Restart on the same data: every acknowledged charge replays with its own id; the
            // ones in flight at the kill either replay (committed) or are made now, once.
            let restarted = try FinanceProcess(dataDir: dir.path, env: env)
            defer { restarted.forceStop() }
            let port2 = try await restarted.waitUntilListening()
            let channel = RPCChannel(host: "127.0.0.1", port: port2)
            let client = Finance_V1_FinanceClient(channel.client)
            var lost: [String] = []
            for s in acked {
                let again = try await client.createCharge(s.request, options: users[s.caller].options)
                if !again.replayed || again.transaction.transactionId != s.id { lost.append(s.request.idempotencyKey) }
            }
            #expect(lost.isEmpty, "acknowledged charges lost or changed: \(lost.prefix(10))")
            var committedInFlight = 0
            for s in inFlight where try await client.createCharge(s.request, options: users[s.caller].options).replayed { committedInFlight += 1 }
            await channel.close()
            restarted.signal(SIGTERM)
            #expect(await restarted.waitForExit() == 0)

            // The files: sound, one transaction per key, balances = history, chains verify.
            let core = try FinanceCore(configuration: FinanceConfiguration(dataDirectory: dir.path), peers: env.peers, logger: quietLogger)
            defer { core.close() }
            let (check, transactions, keys, mismatched) = try core.database.readSync { c in
                (
                    try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) },
                    try c.queryOne("SELECT count(*) FROM ledger_transactions")!.get(0, as: Int64.self),
                    try c.queryOne("SELECT count(*) FROM idempotency_keys")!.get(0, as: Int64.self),
                    try c.queryOne(
                        """
                        SELECT count(*) FROM pair_balances p WHERE balance_cents != (SELECT coalesce(sum(delta_cents), 0) FROM pair_entries e
                          WHERE e.scope = p.scope AND e.user_a = p.user_a AND e.user_b = p.user_b AND e.currency = p.currency)
                        """)!.get(0, as: Int64.self)
                )
            }
            #expect(check == ["ok"])
            #expect(transactions == Int64(acked.count + inFlight.count) && keys == transactions)
            #expect(mismatched == 0)
            let verified = try core.verifyAll()
            #expect(verified.ok, "\(verified.report)")
            print(
                "crash test: \(acked.count) charges acknowledged before SIGKILL, \(inFlight.count) in flight (\(committedInFlight) had committed); "
                    + "\(transactions) transactions after restart, integrity ok, chains verify")
        }
    }
}
