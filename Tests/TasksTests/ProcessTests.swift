import ContractTesting
import Contracts
import Foundation
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Synchronization
import Testing

/// A real service executable (`tasks-service`, `finance-service`) as a child process under
/// `timeout -s KILL` (it stops by itself even if the test runner dies), started through
/// `posix_spawn` (ContractTesting's `Subprocess`), not `Foundation.Process`, which can crash the
/// test process when two start at once; its environment is set by `env(1)`, its output goes to a
/// file scanned for "listening on". Peers are the test world's accounts and social double.
final class ServiceProcess: @unchecked Sendable {
    let dataDir: String
    let logPath: String
    let product: String
    let spawned: pid_t
    private let exit = Mutex<Int32?>(nil)
    private let pidValue = Mutex<Int32?>(nil)
    private(set) var port = 0

    init(
        _ product: String = "tasks-service", dataDir: String, arguments: [String] = [], environment: [String: String] = [:], port: Int = 0
    ) throws {
        self.product = product
        self.dataDir = dataDir
        try? FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        logPath = dataDir + "-\(UUID().uuidString.prefix(8)).log"
        var env = [
            "SERVICE_TOKEN": TestCredentials.serviceToken, "GATEWAY_TOKEN": TestCredentials.gatewayToken, "ALLOW_DEV_CREDENTIALS": "1",
            "LOG_LEVEL": "info", "DATA_DIR": dataDir,
        ]
        for (k, v) in environment { env[k] = v }
        let assignments = env.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        spawned = try Subprocess.spawn(
            "/usr/bin/env",
            assignments + [
                "/usr/bin/timeout", "-s", "KILL", "300", Self.binary(product), "--host", "127.0.0.1", "--port", "\(port)", "--data-dir", dataDir,
            ]
                + arguments,
            stdinPath: "/dev/null", stdoutPath: logPath, stderrPath: logPath)
    }

    static func binary(_ product: String) -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
        return dir.appendingPathComponent(product).path
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
    var pid: Int32? { pidValue.withLock { $0 } }

    /// Whether the child (timeout) still runs; records its exit status once it ended.
    var isRunning: Bool {
        if exit.withLock({ $0 }) != nil { return false }
        var status: Int32 = 0
        let r = waitpid(spawned, &status, WNOHANG)
        guard r == spawned else { return r == 0 }
        let signal = status & 0x7f
        exit.withLock { $0 = signal == 0 ? (status >> 8) & 0xff : 128 + signal }
        return false
    }

    func waitUntilListening(timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        let lock = "\(dataDir)/\(product.replacingOccurrences(of: "-service", with: "")).sqlite.lock"
        while ContinuousClock.now < deadline {
            let text = log
            if let range = text.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let match = text[range]
                port = Int(match[match.index(after: match.lastIndex(of: ":")!)...])!
                let pid = (try? String(contentsOfFile: lock, encoding: .utf8)).flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                pidValue.withLock { $0 = pid }
                return port
            }
            if !isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "\(product) did not start:\n\(log)")
    }

    func signal(_ sig: Int32) { if let pid, isRunning, pid != getpid() { kill(pid, sig) } }

    func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return exit.withLock { $0 }
    }

    /// SIGKILL (no shutdown at all), then waits for the child to be gone.
    func killHard() async {
        signal(SIGKILL)
        _ = await waitForExit()
    }

    func forceStop() {
        signal(SIGKILL)
        if isRunning { kill(spawned, SIGTERM) }  // no pid yet: timeout passes SIGTERM on
        _ = isRunning
        try? FileManager.default.removeItem(atPath: logPath)
    }
}

typealias TasksProcess = ServiceProcess

@Suite("tasks-service: the executable", .serialized)
struct ProcessTests {
    @Test func servesTheAreasHealthReflectionVerifiesItsJournalAndStopsOnSIGTERM() async throws {
        try await withWorld { w in
            let dir = TemporaryDirectory("tasks-proc")
            defer { dir.remove() }
            let peers = ["ACCOUNTS_ADDR": "127.0.0.1:\(w.accountsServer.port)", "SOCIAL_ADDR": "127.0.0.1:\(w.socialServer.port)"]
            let service = try TasksProcess(dataDir: dir.path, environment: peers)
            defer { service.forceStop() }
            let port = try await service.waitUntilListening()
            var cc = ChannelConfiguration(host: "127.0.0.1", port: port)
            cc.maxReceiveMessageSize = 8 << 20
            let channel = RPCChannel(configuration: cc)

            let health = Grpc_Health_V1_HealthClient(channel.client)
            for name in ["", "tasks.v1.Tasks", "tasks.v1.TasksInternal"] {
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
            #expect(Set(services).isSuperset(of: ["tasks.v1.Tasks", "tasks.v1.TasksInternal", "grpc.health.v1.Health"]))

            // A working service: a team task, a 5 MiB attachment through its 6 MiB message limit,
            // a notification delivered by its own outbox to its social peer.
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let tasks = Tasks_V1_TasksClient(channel.client)
            let t = try await tasks.createTeamTask(createTask(with: [bob.username]), options: alice.options).task
            var mk = Tasks_V1_CreateTeamTaskUploadTokenRequest()
            mk.taskId = t.taskId
            var up = Tasks_V1_UploadTeamTaskAttachmentRequest()
            up.uploadToken = try await tasks.createTeamTaskUploadToken(mk, options: alice.options).uploadToken
            up.filename = "big.bin"
            up.data = SecureRandom.bytes(5 * 1024 * 1024)
            let a = try await tasks.uploadTeamTaskAttachment(up).attachment
            var get = Tasks_V1_GetTeamTaskAttachmentRequest()
            get.taskId = t.taskId
            get.attachmentId = a.attachmentId
            #expect(try await tasks.getTeamTaskAttachment(get, options: bob.options).data == up.data)
            #expect(await eventually { w.social.notifications(to: bob.id, kind: .taskAssigned).count == 1 })
            // Marketplace and habits are served by the same process (their migrations applied).
            var r = Tasks_V1_CreateMarketTaskRequest()
            r.idempotencyKey = "p1"
            r.title = "Process task"
            #expect(try await tasks.createMarketTask(r, options: alice.options).task.status == .requested)
            #expect(try await tasks.listMyHabits(Tasks_V1_ListMyHabitsRequest(), options: alice.options).habits.isEmpty)

            // The operator's journal check against the running process.
            let verify = try TasksProcess(dataDir: dir.path + "-verify", arguments: ["--verify-journal"], environment: peers, port: port)
            #expect(await verify.waitForExit() == 0)
            #expect(verify.log.contains("journal intact: 2 entries"), "\(verify.log)")

            await channel.close()
            service.signal(SIGTERM)
            #expect(await service.waitForExit() == 0)
            #expect(service.log.contains("shutting down gracefully"))
            // The database stays (reopened by the next start with its migrations applied once).
            #expect(FileManager.default.fileExists(atPath: dir.path + "/tasks.sqlite"))
        }
    }

    /// D 7.a, exactly once through crashes: tasks-service is killed (SIGKILL) after a task was
    /// marked done and before finance could be told (finance is not running yet); after the
    /// restart the settlement is delivered. Then finance itself is killed (SIGKILL) at moments
    /// while settlements are on their way, and restarted. Each task is settled exactly once, as
    /// the real finance-service's history shows.
    @Test func aSettlementExistsExactlyOnceAfterKill9OfTasksAndOfFinance() async throws {
        try await withWorld { w in
            let dir = TemporaryDirectory("tasks-kill")
            defer { dir.remove() }
            let financePort = closedPort()
            let tasksEnv = [
                "ACCOUNTS_ADDR": "127.0.0.1:\(w.accountsServer.port)", "SOCIAL_ADDR": "127.0.0.1:\(w.socialServer.port)",
                "FINANCE_ADDR": "127.0.0.1:\(financePort)",
            ]
            let financeEnv = ["ACCOUNTS_ADDR": tasksEnv["ACCOUNTS_ADDR"]!, "SOCIAL_ADDR": tasksEnv["SOCIAL_ADDR"]!]
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))

            var tasks = try ServiceProcess(dataDir: dir.path + "/tasks", environment: tasksEnv)
            defer { tasks.forceStop() }
            var channel = RPCChannel(host: "127.0.0.1", port: try await tasks.waitUntilListening())
            func settle(_ title: String) async throws -> String {
                let t = Tasks_V1_TasksClient(channel.client)
                var c = Tasks_V1_CreateMarketTaskRequest()
                c.idempotencyKey = UUID().uuidString
                c.title = title
                let task = try await t.createMarketTask(c, options: alice.options).task.taskId
                var a = Tasks_V1_AcceptBidRequest()
                a.bidId = try await t.placeBid(bidRequest(task, 2500), options: bob.options).bid.bidId
                _ = try await t.acceptBid(a, options: alice.options)
                var d = Tasks_V1_MarkMarketTaskDoneRequest()
                d.taskId = task
                #expect(try await t.markMarketTaskDone(d, options: alice.options).task.status == .done)
                return task
            }
            // 1. Done while finance is down; the settlement waits in the outbox; tasks dies.
            let first = try await settle("Before the crash")
            await tasks.killHard()
            await channel.close()

            var finance = try ServiceProcess("finance-service", dataDir: dir.path + "/finance", environment: financeEnv, port: financePort)
            defer { finance.forceStop() }
            _ = try await finance.waitUntilListening()
            let financeChannel = RPCChannel(host: "127.0.0.1", port: financePort)
            defer { Task { await financeChannel.close() } }
            /// The settlements finance recorded between alice and bob, by task.
            func settlements() async -> [String: Int] {
                var r = Finance_V1_ListTransactionsRequest()
                r.counterpartUserId = bob.id
                r.pageSize = 100
                guard let page = try? await Finance_V1_FinanceClient(financeChannel.client).listTransactions(r, options: alice.options) else {
                    return [:]
                }
                return page.entries.reduce(into: [:]) { $0[$1.taskId, default: 0] += 1 }
            }
            tasks = try ServiceProcess(dataDir: dir.path + "/tasks", environment: tasksEnv)
            channel = RPCChannel(host: "127.0.0.1", port: try await tasks.waitUntilListening())
            #expect(await eventually(timeout: .seconds(30)) { await settlements() == [first: 1] })

            // 2. Finance dies at different moments while settlements are being delivered.
            var tasksDone = [first]
            for (i, pause) in [0, 5, 20, 60].enumerated() {
                tasksDone.append(try await settle("Task \(i)"))
                try await Task.sleep(for: .milliseconds(pause))
                await finance.killHard()
                finance = try ServiceProcess("finance-service", dataDir: dir.path + "/finance", environment: financeEnv, port: financePort)
                _ = try await finance.waitUntilListening()
            }
            let expected = Dictionary(uniqueKeysWithValues: tasksDone.map { ($0, 1) })
            let delivered = await eventually(timeout: .seconds(60)) { await settlements() == expected }
            let seen = await settlements()
            #expect(delivered, "\(seen)")
            // And it stays so: nothing is delivered twice later.
            try await Task.sleep(for: .seconds(2))
            #expect(await settlements() == expected)
            var balances = Finance_V1_GetBalancesRequest()
            balances.householdId = ""
            let owed = try await Finance_V1_FinanceClient(financeChannel.client).getBalances(balances, options: alice.options).balances
            #expect(owed.map(\.amount.amountCents) == [-2500 * Int64(expected.count)], "\(owed)")
            await channel.close()
        }
    }

    @Test func badSettingsRefuseTheStartNamingTheVariable() async throws {
        let dir = TemporaryDirectory("tasks-proc")
        defer { dir.remove() }
        let bad = try TasksProcess(dataDir: dir.path, environment: ["TASKS_PEER_DEADLINE_MS": "soon"])
        defer { bad.forceStop() }
        let status = await bad.waitForExit()
        #expect(status != nil && status != 0)
        #expect(bad.log.contains("TASKS_PEER_DEADLINE_MS"), "\(bad.log)")
        // Without a credential and without the development flag: refused.
        let p = try TasksProcess(dataDir: dir.path, environment: ["ALLOW_DEV_CREDENTIALS": "0", "SERVICE_TOKEN": "change-me-in-production"])
        defer { p.forceStop() }
        let s2 = await p.waitForExit()
        #expect(s2 != nil && s2 != 0)
        // The journal check against no service: exit 2, saying so.
        let v = try TasksProcess(dataDir: dir.path, arguments: ["--verify-journal"], port: 1)
        #expect(await v.waitForExit() == 2)
        #expect(v.log.contains("cannot ask tasks-service"))
    }
}

/// A port nothing listens on (for a peer that is not started yet).
func closedPort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    close(fd)
    return Int(UInt16(bigEndian: addr.sin_port))
}
