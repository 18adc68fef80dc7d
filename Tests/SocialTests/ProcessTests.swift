import Accounts
import ContractTesting
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Synchronization
import Testing

/// The real `social-service` executable as a child process (ServiceCluster's `ServiceProcess`:
/// posix_spawn under `timeout -s KILL`, never Foundation.Process, which can crash the test process
/// when several suites start processes at once), with a real accounts (in this process) as its
/// peer and token issuer; tasks is down (a port where nothing listens).
typealias SocialProcess = ServiceProcess

extension ServiceProcess {
    convenience init(dataDir: String, accountsPort: Int, environment: [String: String] = [:], arguments: [String] = []) throws {
        var env = ["ACCOUNTS_ADDR": "127.0.0.1:\(accountsPort)", "TASKS_ADDR": "127.0.0.1:\(closedPort())"]
        for (k, v) in environment { env[k] = v }
        try self.init(
            "social-service", name: "social", dataDir: dataDir, environment: env,
            arguments: ["--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir] + arguments)
    }
}

/// The real accounts in this process (a peer of the process under test): a cluster of accounts
/// alone.
final class AccountsPeer: Sendable {
    let cluster: ServiceCluster
    init() async throws {
        var options = ClusterOptions([.accounts])
        options.logger = Logger(label: "accounts") { _ in SwiftLogNoOpLogHandler() }
        cluster = try await ServiceCluster.start(options)
    }
    var server: TestServer { cluster.server(.accounts) }
    func user(_ prefix: String) async throws -> User {
        let name = uniqueName(prefix)
        return try await cluster.signUp(name, displayName: "", email: "\(name)@example.com")
    }
    func stop() async { await cluster.stop() }
}

@Suite("social-service: the executable", .serialized)
struct ProcessTests {
    @Test func servesHealthReflectionAndRealCallsAndShutsDownGracefullyEndingStreams() async throws {
        let accounts = try await AccountsPeer()
        let dir = TemporaryDirectory("social-proc")
        defer { dir.remove() }
        let service = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port)
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)

        let health = Grpc_Health_V1_HealthClient(channel.client)
        for name in ["", "social.v1.Social", "social.v1.SocialInternal"] {
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
        #expect(Set(services).isSuperset(of: ["social.v1.Social", "social.v1.SocialInternal", "grpc.health.v1.Health"]))

        // Real calls: tokens verified with accounts' published keys, names from accounts.
        let alice = try await accounts.user("alice"), bob = try await accounts.user("bob")
        let social = Social_V1_SocialClient(channel.client)
        var add = Social_V1_AddFriendRequest()
        add.user.username = bob.username
        #expect(try await social.addFriend(add, options: alice.options).friendship.user.userId == bob.id)
        // A live stream ends with UNAVAILABLE when the process is told to stop, then it exits 0.
        let stream = try await LiveStream.open(social, bob)
        service.signal(SIGTERM)
        #expect(await stream.waitUntilFinished()?.code == .unavailable)
        #expect(await service.waitForExit() == 0)
        #expect(service.log.contains("shutting down gracefully"))
        await channel.close()
        await accounts.stop()
    }

    @Test func environmentConfiguresItAndABadValueRefusesTheStart() async throws {
        let accounts = try await AccountsPeer()
        let dir = TemporaryDirectory("social-proc")
        defer { dir.remove() }
        // One stream per user: a second closes the first.
        let service = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port, environment: ["SOCIAL_SUBSCRIPTIONS_PER_USER": "1"])
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let bob = try await accounts.user("bob")
        let first = try await LiveStream.open(Social_V1_SocialClient(channel.client), bob)
        let second = try await LiveStream.open(Social_V1_SocialClient(channel.client), bob)
        #expect(await first.waitUntilFinished()?.code == .resourceExhausted)
        await second.cancel()
        await channel.close()
        service.signal(SIGTERM)
        #expect(await service.waitForExit() == 0)

        let bad = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port, environment: ["SOCIAL_SUBSCRIPTIONS_PER_USER": "0"])
        defer { bad.forceStop() }
        let status = await bad.waitForExit()
        #expect(status != nil && status != 0)
        #expect(bad.log.contains("SOCIAL_SUBSCRIPTIONS_PER_USER"))
        let flag = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port, arguments: ["--no-such-flag"])
        defer { flag.forceStop() }
        let flagStatus = await flag.waitForExit()
        #expect(flagStatus != nil && flagStatus != 0)
        await accounts.stop()
    }

    /// kill -9 during a burst of SendNotification: after a restart every acknowledged notification
    /// is in its recipient's inbox and the database passes `PRAGMA integrity_check`.
    @Test func killedDuringANotificationBurstLosesNothingAcknowledged() async throws {
        let accounts = try await AccountsPeer()
        let dir = TemporaryDirectory("social-proc")
        defer { dir.remove() }
        let service = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port)
        defer { service.forceStop() }
        let port = try await service.waitUntilListening()
        var recipients: [User] = []
        for _ in 0..<4 { recipients.append(try await accounts.user("r")) }
        let ids = recipients.map(\.id)
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let internalAPI = Social_V1_SocialInternalClient(
            RPCClient(transport: CredentialedTransport(base: channel, serviceToken: TestCredentials.serviceToken)))

        let acknowledged = Shared<[String: String]>([:])  // notification id → recipient
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<8 {
                    group.addTask {
                        var i = 0
                        while !Task.isCancelled {
                            i += 1
                            var r = Social_V1_SendNotificationRequest()
                            r.eventId = "crash:\(worker):\(i)"
                            r.recipientUserIds = [ids[i % ids.count]]
                            r.kind = .taskReminder
                            r.title = "Reminder \(worker)/\(i)"
                            do {
                                let out = try await internalAPI.sendNotification(r, options: CallOptions(timeout: .seconds(5)))
                                acknowledged.withLock { a in for (user, id) in out.notificationIds { a[id] = user } }
                            } catch {
                                return  // the server is gone
                            }
                        }
                    }
                }
            }
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while acknowledged.withLock({ $0.count }) < 300 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        service.signal(SIGKILL)
        let status = await service.waitForExit()
        #expect(status == 137 || status == 9, "exit status \(String(describing: status))")
        burst.cancel()
        await burst.value
        await channel.close()
        let acked = acknowledged.withLock { $0 }
        #expect(acked.count >= 300)

        // Restart on the same data: every acknowledged notification is in its recipient's inbox.
        let restarted = try SocialProcess(dataDir: dir.path, accountsPort: accounts.server.port)
        defer { restarted.forceStop() }
        let port2 = try await restarted.waitUntilListening()
        let channel2 = RPCChannel(host: "127.0.0.1", port: port2)
        let social = Social_V1_SocialClient(channel2.client)
        var found = Set<String>()
        for user in recipients {
            var list = Social_V1_ListNotificationsRequest()
            list.pageSize = 100
            while true {
                let page = try await social.listNotifications(list, options: user.options)
                found.formUnion(page.notifications.map(\.notificationId))
                if page.nextPageToken.isEmpty { break }
                list.pageToken = page.nextPageToken
            }
        }
        let missing = Set(acked.keys).subtracting(found)
        #expect(missing.isEmpty, "acknowledged notifications lost: \(missing.prefix(5))")
        await channel2.close()
        restarted.signal(SIGTERM)
        #expect(await restarted.waitForExit() == 0)

        let core = try SocialCore(
            configuration: SocialConfiguration(dataDirectory: dir.path),
            peers: PeerClients { _ in TestServer.peerClient(port: closedPort()) })
        defer { core.close() }
        let check = try core.database.readSync { c in try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) } }
        #expect(check == ["ok"])
        print("crash test: \(acked.count) notifications acknowledged before SIGKILL, \(found.count) in the inboxes after restart, integrity ok")
        await accounts.stop()
    }
}
