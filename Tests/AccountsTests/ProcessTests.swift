import Accounts
import Contracts
import Foundation
import RPCCore
import RPCTransport
import ServiceKit
import Synchronization
import Testing

/// The real `accounts-service` executable as a child process, under `timeout -s KILL`, so it stops
/// by itself even if the test runner dies. Its stderr is drained continuously (a full pipe would
/// block its logging) and scanned for the "listening on" line that gives the port.
final class ServiceProcess: @unchecked Sendable {
    let process = Process()
    let dataDir: String
    private let output = CapturedLogs()
    private(set) var port = 0

    init(dataDir: String, extraArguments: [String] = [], environment: [String: String] = [:]) throws {
        self.dataDir = dataDir
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments =
            [
                "-s", "KILL", "300", builtProduct("accounts-service"), "--host", "127.0.0.1", "--port", "0",
                "--data-dir", dataDir,
            ] + extraArguments
        var env = ProcessInfo.processInfo.environment
        env["SERVICE_TOKEN"] = testServiceToken
        env["ALLOW_DEV_CREDENTIALS"] = "1"  // the test credentials are short; the gateway's is generated
        env["DATA_DIR"] = dataDir
        env["ACCOUNTS_SCRYPT_N"] = "1024"
        env["LOG_LEVEL"] = "info"
        for (k, v) in environment { env[k] = v }
        process.environment = env
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = pipe
        let output = self.output
        pipe.fileHandleForReading.readabilityHandler = { handle in
            let data = handle.availableData
            if !data.isEmpty { output.append(String(decoding: data, as: UTF8.self)) }
        }
        try process.run()
    }

    var log: String { output.all.joined() }

    /// Waits for "listening on 127.0.0.1:<port>".
    func waitUntilListening(timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let range = log.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let text = log[range]
                port = Int(text[text.index(after: text.lastIndex(of: ":")!)...])!
                pid = Self.lockHolder(dataDir)
                return port
            }
            if !process.isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "accounts-service did not start:\n\(log)")
    }

    /// The service's own pid (the child of `timeout`), read from its database lock file once it
    /// listens (later the file may name another holder, such as the test process itself).
    private(set) var pid: Int32?

    static func lockHolder(_ dataDir: String) -> Int32? {
        (try? String(contentsOfFile: "\(dataDir)/accounts.sqlite.lock", encoding: .utf8))
            .flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Signals the service while it runs (never a pid that may have been reused since).
    func signal(_ sig: Int32) {
        if let pid, process.isRunning, pid != getpid() { kill(pid, sig) }
    }

    /// Waits for the process (timeout's exit status is the service's).
    func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    func forceStop() {
        signal(SIGKILL)
        // No pid yet: timeout passes SIGTERM on to the service.
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
    }
}

@Suite("accounts-service: the executable", .serialized)
struct ProcessTests {
    static func tempDir() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("accounts-proc-\(UUID().uuidString)").path
    }

    @Test func servesHealthReflectionAndShutsDownGracefully() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try ServiceProcess(dataDir: dir)
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)

        let health = Grpc_Health_V1_HealthClient(channel.client)
        for name in ["", "accounts.v1.Accounts", "accounts.v1.AccountsInternal"] {
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
        #expect(Set(services).isSuperset(of: ["accounts.v1.Accounts", "accounts.v1.AccountsInternal", "grpc.health.v1.Health"]))

        // A working service: sign up through the real process, with the signing key saved 0600.
        let signed = try await Accounts_V1_AccountsClient(channel.client).signUp(signUpRequest(uniqueName()))
        #expect(!signed.session.accessToken.isEmpty)
        let attributes = try FileManager.default.attributesOfItem(atPath: "\(dir)/signing-key.pem")
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        #expect(service.log.contains("scrypt(N=1024, r=8, p=1"))

        await channel.close()
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)
        #expect(service.log.contains("shutting down gracefully"))
    }

    @Test func environmentVariablesConfigureIt() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try ServiceProcess(dataDir: dir, environment: ["ACCOUNTS_SCRYPT_N": "2048", "ACCOUNTS_MAILDIR": "\(dir)/outbox-mail"])
        defer { service.forceStop() }
        _ = try await service.waitUntilListening()
        #expect(service.log.contains("scrypt(N=2048, r=8, p=1"))
        #expect(FileManager.default.fileExists(atPath: "\(dir)/outbox-mail/new"))
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)

        // A bad value is refused at startup with a message, not a crash.
        let bad = try ServiceProcess(dataDir: dir, environment: ["ACCOUNTS_SCRYPT_N": "1000"])
        defer { bad.forceStop() }
        let status = await bad.waitForExit()
        #expect(status != nil && status != 0)
        #expect(bad.log.contains("power of two"))
    }

    /// `LOG_FORMAT=json`: everything the process writes, from start to graceful stop, is one JSON
    /// object per line, and the "listening on" line the helpers scan for is in its `msg`.
    @Test func jsonLogsAreOneObjectPerLine() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try ServiceProcess(dataDir: dir, environment: ["LOG_FORMAT": "json"])
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let name = uniqueName()
        _ = try await Accounts_V1_AccountsClient(channel.client).signUp(signUpRequest(name))
        await channel.close()
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)
        // The pipe is drained on another thread: wait for the last line.
        let deadline = ContinuousClock.now + .seconds(10)
        while !(service.log.contains(#""msg":"stopped""#) && service.log.hasSuffix("\n")) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let log = service.log
        let lines = log.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(log.hasSuffix("\n") && lines.count >= 4, "\(log)")
        var messages: [String] = []
        for line in lines {
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            let o = try #require(object, "not a JSON object: \(line)")
            #expect(o["ts"] is String && o["level"] is String && o["logger"] is String && o["source"] is String, "\(line)")
            messages.append(try #require(o["msg"] as? String))
        }
        #expect(messages.contains { $0.hasPrefix("accounts listening on 127.0.0.1:\(port) ") })
        #expect(messages.contains("shutting down gracefully"))
        #expect(messages.contains { $0.contains("scrypt(N=1024, r=8, p=1") })
        #expect(!log.contains("correct horse battery staple"), "no password in the log")

        // Any other format refuses the start, naming the variable and the allowed values.
        let bad = try ServiceProcess(dataDir: dir, environment: ["LOG_FORMAT": "xml"])
        defer { bad.forceStop() }
        let status = await bad.waitForExit()
        #expect(status != nil && status != 0)
        #expect(bad.log.contains("LOG_FORMAT must be one of text, json, got 'xml'"), "\(bad.log)")
    }

    /// One access-log line per call, with the method, the status, the duration, the peer and the
    /// user when the call was authenticated; never the token or the password.
    @Test func eachCallGetsOneAccessLogLine() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try ServiceProcess(dataDir: dir, environment: ["LOG_FORMAT": "json"])
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let client = Accounts_V1_AccountsClient(channel.client)
        let signed = try await client.signUp(signUpRequest(uniqueName()))
        let token = signed.session.accessToken
        _ = try await client.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(token))
        await expectFailure(.unauthenticated) {
            _ = try await client.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer("not-a-token"))
        }
        // A health check that answers is counted, not logged.
        #expect(try await Grpc_Health_V1_HealthClient(channel.client).check(Grpc_Health_V1_HealthCheckRequest()).status == .serving)
        await channel.close()
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)
        let deadline = ContinuousClock.now + .seconds(10)
        while !(service.log.contains(#""msg":"stopped""#) && service.log.hasSuffix("\n")) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let access = try service.log.split(separator: "\n").compactMap { line -> [String: Any]? in
            let o = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            return o?["logger"] as? String == "access" ? o : nil
        }
        func lines(_ method: String) -> [[String: Any]] { access.filter { $0["rpc.method"] as? String == method } }
        let signUp = lines("accounts.v1.Accounts/SignUp")
        #expect(signUp.count == 1 && signUp.first?["rpc.code"] as? String == "OK" && signUp.first?["user"] == nil)
        let profile = lines("accounts.v1.Accounts/GetMyProfile")
        #expect(profile.count == 2, "\(access)")
        let ok = profile.first { $0["rpc.code"] as? String == "OK" }
        #expect(ok?["user"] as? String == signed.user.userId)
        #expect((ok?["peer"] as? String)?.hasPrefix("127.0.0.1:") == true)
        #expect(Double(ok?["duration_ms"] as? String ?? "") != nil)
        let refused = profile.first { $0["rpc.code"] as? String == "UNAUTHENTICATED" }
        #expect(refused != nil && refused?["user"] == nil)
        #expect(lines("grpc.health.v1.Health/Check").isEmpty)
        #expect(!service.log.contains(token) && !service.log.contains("not-a-token"), "no token in the log")
        #expect(!service.log.contains("correct horse battery staple"), "no password in the log")

        // ACCESS_LOG=off: none.
        let quiet = try ServiceProcess(dataDir: dir, environment: ["LOG_FORMAT": "json", "ACCESS_LOG": "off"])
        defer { quiet.forceStop() }
        let quietPort = try await quiet.waitUntilListening()
        let quietChannel = RPCChannel(host: "127.0.0.1", port: quietPort)
        _ = try await Accounts_V1_AccountsClient(quietChannel.client).getSigningKeys(Accounts_V1_GetSigningKeysRequest())
        await quietChannel.close()
        quiet.signal(SIGTERM)
        #expect(await quiet.waitForExit() == 0)
        #expect(!quiet.log.contains(#""logger":"access""#))
    }

    /// kill -9 during a burst of sign-ups: after a restart every acknowledged sign-up is there and
    /// the database passes `PRAGMA integrity_check`.
    @Test func killedDuringSignUpsLosesNothingAcknowledged() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // Every sign-up comes from this one address: lift the per-address limit for the burst.
        let burstEnvironment = ["ACCOUNTS_SIGNUPS_PER_ADDRESS": "100000"]
        let service = try ServiceProcess(dataDir: dir, environment: burstEnvironment)
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let client = Accounts_V1_AccountsClient(channel.client)

        let acknowledged = CapturedLogs()
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<8 {
                    group.addTask {
                        var i = 0
                        while !Task.isCancelled {
                            i += 1
                            let name = "crash\(worker)_\(i)"
                            do {
                                _ = try await client.signUp(signUpRequest(name), options: CallOptions(timeout: .seconds(5)))
                                acknowledged.append(name)
                            } catch {
                                return  // the server is gone
                            }
                        }
                    }
                }
            }
        }
        // Let the burst run, then kill the process mid-stream.
        let deadline = ContinuousClock.now + .seconds(20)
        while acknowledged.all.count < 150 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        service.signal(SIGKILL)
        let status = await service.waitForExit()
        #expect(status == 137 || status == 9 || status == 128 + 9, "exit status \(String(describing: status))")
        burst.cancel()
        await burst.value
        await channel.close()
        let acked = acknowledged.all
        #expect(acked.count >= 150)

        // Restart on the same data directory: every acknowledged account exists and logs in.
        let restarted = try ServiceProcess(dataDir: dir)
        defer { restarted.forceStop() }
        let port2 = try await restarted.waitUntilListening()
        let channel2 = RPCChannel(host: "127.0.0.1", port: port2)
        let internalAPI = Accounts_V1_AccountsInternalClient(
            RPCClient(transport: CredentialedTransport(base: channel2, serviceToken: testServiceToken)))
        var missing: [String] = []
        for start in stride(from: 0, to: acked.count, by: 200) {
            var r = Accounts_V1_ResolveUsernamesRequest()
            r.usernames = Array(acked[start..<min(acked.count, start + 200)])
            missing += try await internalAPI.resolveUsernames(r).unknownUsernames
        }
        #expect(missing.isEmpty, "acknowledged sign-ups lost: \(missing.prefix(10))")
        let last = try #require(acked.last)
        _ = try await Accounts_V1_AccountsClient(channel2.client).logIn(logInRequest(username: last, password: "correct horse battery staple"))
        await channel2.close()
        restarted.signal(SIGTERM)
        #expect(await restarted.waitForExit() == 0)

        // The database file is sound.
        let core = try AccountsCore(configuration: TestAccounts.testConfiguration(dir))
        defer { core.close() }
        let check = try core.database.readSync { c in try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) } }
        #expect(check == ["ok"])
        let users = try core.database.readSync { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int64.self) }
        #expect(users >= Int64(acked.count))
        print("crash test: \(acked.count) sign-ups acknowledged before SIGKILL, \(users) accounts after restart, integrity ok")
    }
}
