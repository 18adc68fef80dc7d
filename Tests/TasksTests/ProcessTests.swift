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
/// when two start at once), its peers given in `environment` (the test world's real accounts and
/// social: `ServiceProcess.peerEnvironment`).
typealias TasksProcess = ServiceProcess

extension ServiceProcess {
    convenience init(dataDir: String, arguments: [String] = [], environment: [String: String] = [:], port: Int = 0) throws {
        try self.init(
            "tasks-service", name: "tasks", dataDir: dataDir, environment: environment,
            arguments: ["--host", "127.0.0.1", "--port", "\(port)", "--data-dir", dataDir] + arguments)
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
            // Marketplace and habits are the next part: a clear UNIMPLEMENTED until then.
            await expectFailure(.unimplemented) { try await tasks.listMyHabits(Tasks_V1_ListMyHabitsRequest(), options: alice.options) }

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
