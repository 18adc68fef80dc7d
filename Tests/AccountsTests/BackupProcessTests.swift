import Accounts
import ContractTesting
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import ServiceKit
import Storage
import Testing

extension ProcessTests {
    /// The real `accounts-service`: `backup` (its own executable, another process) copies the
    /// database while the service serves a burst of sign-ups; `restore` is refused while the service
    /// runs, and for a file of another service or garbage; once the service stopped it restores,
    /// and the service started on the restored data serves every sign-up acknowledged before the
    /// backup began, and not one made after it finished.
    @Test func backupWhileServingAndRestoreOnceStopped() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let data = dir + "/accounts"
        let executable = builtProduct("accounts-service")
        func run(_ arguments: [String]) async throws -> (status: Int32, output: String) {
            let r = try await Subprocess.capture(executable, arguments, input: [])
            return (r.status, String(decoding: r.stdout + r.stderr, as: UTF8.self))
        }

        // Every sign-up comes from this one address: lift the per-address limit for the burst.
        let service = try ServiceProcess(dataDir: data, environment: ["ACCOUNTS_SIGNUPS_PER_ADDRESS": "100000"])
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let client = Accounts_V1_AccountsClient(channel.client)
        let acknowledged = CapturedLogs()
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<4 {
                    group.addTask {
                        var i = 0
                        while !Task.isCancelled {
                            i += 1
                            let name = "backup\(worker)_\(i)"
                            guard (try? await client.signUp(signUpRequest(name), options: CallOptions(timeout: .seconds(10)))) != nil else { return }
                            acknowledged.append(name)
                        }
                    }
                }
            }
        }
        let deadline = ContinuousClock.now + .seconds(60)
        while acknowledged.all.count < 40 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        let before = acknowledged.all
        try #require(before.count >= 40)

        // The backup, while the burst goes on.
        let backup = dir + "/accounts.backup"
        let taken = try await run(["backup", "--data-dir", data, "--to", backup])
        #expect(taken.status == 0, "\(taken.output)")
        #expect(taken.output.contains("integrity ok"))
        // Restoring into the running service's directory is refused.
        let whileRunning = try await run(["restore", "--data-dir", data, "--from", backup])
        #expect(whileRunning.status != 0)
        #expect(whileRunning.output.contains("the service is running on \(data)"), "\(whileRunning.output)")

        burst.cancel()
        await burst.value
        let during = acknowledged.all.count - before.count
        // A sign-up made after the backup finished: not in the backup.
        _ = try await client.signUp(signUpRequest("after_the_backup"))
        await channel.close()
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)

        // Refused with the service stopped too: another service's file, and garbage.
        let quiet = Logger(label: "backup-test") { _ in SwiftLogNoOpLogHandler() }
        let social = DatabaseSchema(service: "social", migrations: [])
        try Database.open(directory: dir + "/social", schema: social, logger: quiet).close()
        let socialBackup = try Database.backup(schema: social, directory: dir + "/social", to: dir + "/social.backup").path
        let wrong = try await run(["restore", "--data-dir", data, "--from", socialBackup])
        #expect(wrong.status != 0)
        #expect(wrong.output.contains("is a database of the social service, not accounts"), "\(wrong.output)")
        let garbage = dir + "/garbage.backup"
        _ = FileManager.default.createFile(atPath: garbage, contents: Data((0..<4096).map { _ in UInt8.random(in: 0...255) }))
        let notDatabase = try await run(["restore", "--data-dir", data, "--from", garbage])
        #expect(notDatabase.status != 0)
        #expect(notDatabase.output.contains("is not an SQLite database"), "\(notDatabase.output)")

        let restored = try await run(["restore", "--data-dir", data, "--from", backup])
        #expect(restored.status == 0, "\(restored.output)")

        // The service on the restored data.
        let restarted = try ServiceProcess(dataDir: data)
        defer { restarted.forceStop() }
        let port2 = try await restarted.waitUntilListening()
        let channel2 = RPCChannel(host: "127.0.0.1", port: port2)
        let internalAPI = Accounts_V1_AccountsInternalClient(
            RPCClient(transport: CredentialedTransport(base: channel2, serviceToken: testServiceToken)))
        var r = Accounts_V1_ResolveUsernamesRequest()
        r.usernames = before
        #expect(try await internalAPI.resolveUsernames(r).unknownUsernames.isEmpty, "acknowledged sign-ups missing from the backup")
        r.usernames = ["after_the_backup"]
        #expect(try await internalAPI.resolveUsernames(r).unknownUsernames == ["after_the_backup"])
        let last = try #require(before.last)
        _ = try await Accounts_V1_AccountsClient(channel2.client).logIn(logInRequest(username: last, password: "correct horse battery staple"))
        await channel2.close()
        restarted.signal(SIGTERM)
        #expect(await restarted.waitForExit() == 0)

        let core = try AccountsCore(configuration: TestAccounts.testConfiguration(data), logger: quiet)
        defer { core.close() }
        let check = try core.database.readSync { c in try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) } }
        #expect(check == ["ok"])
        print("backup of a serving accounts-service: \(before.count) sign-ups acknowledged before it, \(during) more during and after it")
    }
}
