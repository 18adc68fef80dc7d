import Contracts
import Finance
import Foundation
import RPCCore
import RPCTransport
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Storage
import Synchronization
import Testing

/// The real `finance-service` executable as a child process (ServiceCluster's `ServiceProcess`:
/// posix_spawn under `timeout -s KILL`, never Foundation.Process, which can crash the test binary
/// when two start at once); its peers are the test cluster's real accounts and social.
typealias FinanceProcess = ServiceProcess

extension ServiceProcess {
    convenience init(dataDir: String, env: FinanceEnv, arguments: [String]? = nil, environment: [String: String] = [:]) throws {
        var e = ServiceProcess.peerEnvironment(env.cluster)
        e["DATA_DIR"] = dataDir
        for (k, v) in environment { e[k] = v }
        try self.init("finance-service", name: "finance", dataDir: dataDir, environment: e, arguments: arguments)
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
            let h = try await env.household([a, b])
            let finance = Finance_V1_FinanceClient(channel.client)
            let t = try await finance.createCharge(chargeRequest(h, 1000, among: [b]), options: a.options).transaction
            var r = Finance_V1_GetBalancesRequest()
            r.householdId = h
            #expect(try await finance.getBalances(r, options: b.options).balances.map(\.amount.amountCents) == [-1000])
            // Its outbox reaches social.
            #expect(try await env.moneyNotification(to: b, about: t.transactionId) != nil)
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
        try await withFinance(slowSocial: true) { env in
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
            let h = try await env.household([a, b])
            env.setSocialDelay(.seconds(2))
            let started = ContinuousClock.now
            await expectFailure(.unavailable) {
                try await Finance_V1_FinanceClient(channel.client).createCharge(chargeRequest(h, 100, among: [b]), options: a.options)
            }
            #expect(ContinuousClock.now - started < .milliseconds(1500))
            env.setSocialDelay(.zero)
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
            let h = try await env.household(users)
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
            let core = try FinanceCore(
                configuration: FinanceConfiguration(dataDirectory: dir.path), peers: env.cluster.makePeers(), logger: quietLogger)
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
