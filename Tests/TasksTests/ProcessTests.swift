import Contracts
import Foundation
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Synchronization
import Testing

/// The real `tasks-service` executable as a child process (under `timeout -s KILL`, so it stops by
/// itself even if the test runner dies), with the real accounts and the social double of the
/// test world as its peers at their addresses (`ACCOUNTS_ADDR`, `SOCIAL_ADDR`).
final class TasksProcess: @unchecked Sendable {
    let process = Process()
    let dataDir: String
    private let output = Output()
    private(set) var port = 0
    private(set) var pid: Int32?

    init(dataDir: String, arguments: [String] = [], environment: [String: String] = [:], port: Int = 0) throws {
        self.dataDir = dataDir
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments = ["-s", "KILL", "300", Self.binary, "--host", "127.0.0.1", "--port", "\(port)", "--data-dir", dataDir] + arguments
        var env = ProcessInfo.processInfo.environment
        env["SERVICE_TOKEN"] = TestCredentials.serviceToken
        env["GATEWAY_TOKEN"] = TestCredentials.gatewayToken
        env["ALLOW_DEV_CREDENTIALS"] = "1"
        env["LOG_LEVEL"] = "info"
        for (k, v) in environment { env[k] = v }
        process.environment = env
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = pipe
        let output = self.output
        pipe.fileHandleForReading.readabilityHandler = { handle in
            let data = handle.availableData
            if !data.isEmpty { output.text.withLock { $0 += String(decoding: data, as: UTF8.self) } }
        }
        try process.run()
    }

    static var binary: String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
        return dir.appendingPathComponent("tasks-service").path
    }

    var log: String { output.text.withLock { $0 } }

    final class Output: Sendable { let text = Mutex("") }

    func waitUntilListening(timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let range = log.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let text = log[range]
                port = Int(text[text.index(after: text.lastIndex(of: ":")!)...])!
                pid = (try? String(contentsOfFile: "\(dataDir)/tasks.sqlite.lock", encoding: .utf8))
                    .flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                return port
            }
            if !process.isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "tasks-service did not start:\n\(log)")
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
