import Contracts
import Foundation
import RPCCore
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Synchronization
import Testing

/// The real `tasks-service` executable as a child process (ServiceCluster's `ServiceProcess`:
/// posix_spawn under `timeout -s KILL`, never Foundation.Process, which can crash the test binary
/// when two start at once), its peers given in `environment` (the test world's real accounts,
/// social and finance: `ServiceProcess.peerEnvironment`). The kill -9 test also starts real
/// `finance-service` processes (`financeProcess`).
typealias TasksProcess = ServiceProcess

extension ServiceProcess {
    convenience init(dataDir: String, arguments: [String] = [], environment: [String: String] = [:], port: Int = 0) throws {
        try self.init(
            "tasks-service", name: "tasks", dataDir: dataDir, environment: environment,
            arguments: ["--host", "127.0.0.1", "--port", "\(port)", "--data-dir", dataDir] + arguments)
    }

    /// A `finance-service` process on `dataDir` (a port of its own each start).
    static func financeProcess(dataDir: String, environment: [String: String]) throws -> ServiceProcess {
        try ServiceProcess("finance-service", name: "finance", dataDir: dataDir, environment: environment)
    }

    /// SIGKILL (no shutdown at all), then waits for the child to be gone.
    func killHard() async {
        signal(SIGKILL)
        _ = await waitForExit()
    }
}

@Suite("tasks-service: the executable", .serialized)
struct ProcessTests {
    @Test func servesTheAreasHealthReflectionVerifiesItsJournalAndStopsOnSIGTERM() async throws {
        try await withWorld { w in
            let dir = TemporaryDirectory("tasks-proc")
            defer { dir.remove() }
            let peers = ServiceProcess.peerEnvironment(w.cluster)
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
            #expect(await eventually { (try? await w.notifications(to: bob, kind: .taskAssigned).count) == 1 })
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
    /// the real finance-service's history shows. tasks reaches finance at one address (a
    /// `DelayProxy` without delay, moved to each new finance process: never a freed port bound
    /// again); both processes' other peers are the world's accounts and social.
    @Test func aSettlementExistsExactlyOnceAfterKill9OfTasksAndOfFinance() async throws {
        try await withWorld { w in
            let dir = TemporaryDirectory("tasks-kill")
            defer { dir.remove() }
            let financeAddress = try await DelayProxy(upstreamPort: nil)
            let peers = ServiceProcess.peerEnvironment(w.cluster)
            var tasksEnv = peers
            tasksEnv["FINANCE_ADDR"] = "127.0.0.1:\(financeAddress.port)"
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))

            var tasks = try TasksProcess(dataDir: dir.path + "/tasks", environment: tasksEnv)
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

            var finance = try ServiceProcess.financeProcess(dataDir: dir.path + "/finance", environment: peers)
            defer { finance.forceStop() }
            financeAddress.setUpstream(try await finance.waitUntilListening())
            // The test reads finance at the same address as tasks.
            let financeChannel = RPCChannel(host: "127.0.0.1", port: financeAddress.port)
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
            tasks = try TasksProcess(dataDir: dir.path + "/tasks", environment: tasksEnv)
            channel = RPCChannel(host: "127.0.0.1", port: try await tasks.waitUntilListening())
            #expect(await eventually(timeout: .seconds(30)) { await settlements() == [first: 1] })

            // 2. Finance dies at different moments while settlements are being delivered.
            var tasksDone = [first]
            for (i, pause) in [0, 5, 20, 60].enumerated() {
                tasksDone.append(try await settle("Task \(i)"))
                try await Task.sleep(for: .milliseconds(pause))
                await finance.killHard()
                financeAddress.setUpstream(nil)
                finance = try ServiceProcess.financeProcess(dataDir: dir.path + "/finance", environment: peers)
                financeAddress.setUpstream(try await finance.waitUntilListening())
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
            await financeChannel.close()
            await channel.close()
            await financeAddress.close()
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
