import Accounts
import Contracts
import Finance
import Foundation
import Logging
import RPCCore
import RPCTransport
import Security
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Synchronization
import Tasks

// TEST-ONLY INFRASTRUCTURE (a library because test targets cannot depend on test targets; no
// service or executable may depend on it). It starts any subset of the REAL services in this
// process, each core on the kit's `TestServer` (127.0.0.1:0, the kit's access policy, real gRPC,
// real SQLite files in a temporary directory), wired to each other by name as the process host
// wires them (`<PEER>_ADDR` → here a port table), each service's outbox delivered to its peers by
// `OutboxDelivery` with `OutboxSenders.rpc` as `ServiceHost.run` does. accounts always runs: it
// issues every token and mails household invites. No service here is a stand-in: a test that
// needs a peer to be slow puts a `DelayProxy` (a slow network) in front of the real one, and a
// peer that is down is the real server refusing every call (`setDown`), which is what a
// restarting process answers (re-binding a freed port raced other tests under load: 6c8b3cc).
// The services' modules never import each other; only this library sees them all.

/// The services a cluster can run (a new service adds its case and its start below).
public enum ClusterService: String, CaseIterable, Sendable {
    case accounts, social, finance, tasks
}

/// What to start and how.
public struct ClusterOptions: Sendable {
    /// The services to run (accounts always runs).
    public var services: Set<ClusterService>
    /// A service's clock (tests move time); a service without one uses the system clock.
    public var clocks: [ClusterService: ManualClock] = [:]
    /// Services the others reach through a `DelayProxy` (`ServiceCluster.setDelay`).
    public var proxied: Set<ClusterService> = []
    /// Services the others are told live at a port where nothing answers, although they run
    /// (tests call them directly; their peers find them down).
    public var unreachable: Set<ClusterService> = []
    /// Each service's settings beyond the cluster's defaults.
    public var accounts: @Sendable (inout AccountsConfiguration) -> Void = { _ in }
    public var social: @Sendable (inout SocialConfiguration) -> Void = { _ in }
    public var finance: @Sendable (inout FinanceConfiguration) -> Void = { _ in }
    public var tasks: @Sendable (inout TasksConfiguration) -> Void = { _ in }
    /// Outbox delivery: quick retries, so a peer that comes back is reached within a second.
    public var outboxRetry = OutboxRetryPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(200))
    public var outboxPollInterval: Duration = .milliseconds(200)
    public var outboxTimeout: Duration = .seconds(5)
    /// The services' logs: none unless `CLUSTER_TEST_LOG=1` (stderr).
    public var logger: Logger = ServiceCluster.defaultLogger

    public init(_ services: Set<ClusterService>) { self.services = services.union([.accounts]) }
}

/// A user signed up with the cluster's accounts.
public struct ClusterUser: Sendable, Hashable {
    public var id: String
    public var username: String
    public var email: String
    public var displayName: String
    public var token: String
    public init(id: String, username: String, email: String, displayName: String, token: String) {
        self.id = id
        self.username = username
        self.email = email
        self.displayName = displayName
        self.token = token
    }
    /// Call options carrying the user's access token.
    public var options: CallOptions { bearer(token) }
}

/// Real services on loopback, wired to each other; `stop()` ends them all and removes their data.
public final class ServiceCluster: Sendable {
    public static let defaultLogger: Logger =
        ProcessInfo.processInfo.environment["CLUSTER_TEST_LOG"] == "1"
        ? Logger(label: "cluster") { StreamLogHandler.standardError(label: $0) }
        : Logger(label: "cluster") { _ in SwiftLogNoOpLogHandler() }

    public let directory: TemporaryDirectory
    public let options: ClusterOptions
    public let accountsCore: AccountsCore
    public let socialCore: SocialCore?
    public let financeCore: FinanceCore?
    public let tasksCore: TasksCore?
    private let servers: [ClusterService: TestServer]
    private let gates: [ClusterService: Gate]
    private let proxies: [ClusterService: DelayProxy]
    private let peerClients: [PeerClients]
    private let nowhere: ClosedPort
    private let jobs: Task<Void, Never>
    private let stopped = Mutex(false)
    private let extraPeers = Mutex<[PeerClients]>([])

    private init(
        directory: TemporaryDirectory, options: ClusterOptions, accountsCore: AccountsCore, socialCore: SocialCore?,
        financeCore: FinanceCore?, tasksCore: TasksCore?, servers: [ClusterService: TestServer], gates: [ClusterService: Gate],
        proxies: [ClusterService: DelayProxy], peerClients: [PeerClients], nowhere: ClosedPort, jobs: Task<Void, Never>
    ) {
        self.directory = directory
        self.options = options
        self.accountsCore = accountsCore
        self.socialCore = socialCore
        self.financeCore = financeCore
        self.tasksCore = tasksCore
        self.servers = servers
        self.gates = gates
        self.proxies = proxies
        self.peerClients = peerClients
        self.nowhere = nowhere
        self.jobs = jobs
    }

    /// Starts `options.services` (accounts first: its keys verify every token).
    public static func start(_ options: ClusterOptions) async throws -> ServiceCluster {
        let directory = TemporaryDirectory("cluster")
        let logger = options.logger
        let nowhere = try ClosedPort()
        let ports = PortTable(nowhere: nowhere.port)
        var servers: [ClusterService: TestServer] = [:]
        var gates: [ClusterService: Gate] = [:]
        var proxies: [ClusterService: DelayProxy] = [:]
        var peerClients: [PeerClients] = []
        var jobs: [@Sendable () async -> Void] = []
        var cores: (social: SocialCore?, finance: FinanceCore?, tasks: TasksCore?) = (nil, nil, nil)
        var accountsCore: AccountsCore?

        func clock(_ s: ClusterService) -> any WallClock { options.clocks[s] ?? SystemClock() }
        /// The peers of one service, as its process would have them (one connection per peer).
        func peers() -> PeerClients {
            let p = PeerClients(serviceToken: TestCredentials.serviceToken) { name in
                var c = ChannelConfiguration(host: "127.0.0.1", port: ports.port(name))
                c.connectTimeout = .seconds(1)
                c.maxBackoff = .milliseconds(200)
                return c
            }
            peerClients.append(p)
            return p
        }
        func outbox(_ database: Database, _ senders: OutboxSenders) {
            let delivery = OutboxDelivery(
                database: database, retry: options.outboxRetry, pollInterval: options.outboxPollInterval, logger: logger,
                deliver: senders.deliver)
            jobs.append { await delivery.run() }
        }
        func serve(_ s: ClusterService, _ services: [any RPCService], maxRequest: Int? = nil) async throws {
            let gate = Gate()
            let server = try await TestServer(services: services, keys: accountsCore!.signingKeySource, logger: logger) { c in
                c.interceptors.insert(gate, at: 0)
                if let maxRequest { c.maxReceiveMessageSize = maxRequest }
            }
            servers[s] = server
            gates[s] = gate
            var peerPort = server.port
            if options.proxied.contains(s) {
                let proxy = try await DelayProxy(upstreamPort: server.port)
                proxies[s] = proxy
                peerPort = proxy.port
            }
            if !options.unreachable.contains(s) { ports.set(s.rawValue, peerPort) }
        }

        do {
            var ac = AccountsConfiguration(dataDirectory: directory.path + "/accounts")
            ac.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)  // cheap scrypt
            ac.maxSignUpsPerAddress = 100_000
            options.accounts(&ac)
            let accounts = try AccountsCore(configuration: ac, logger: logger)
            accountsCore = accounts
            try await serve(.accounts, accounts.services, maxRequest: ac.maxRequestBytes)
            outbox(accounts.database, accounts.outboxSenders(peers: peers()))
            jobs.append { await accounts.runResetMails() }

            if options.services.contains(.social) {
                var c = SocialConfiguration(dataDirectory: directory.path + "/social")
                c.peerDeadline = .seconds(2)
                options.social(&c)
                let p = peers()
                let core = try SocialCore(configuration: c, peers: p, clock: clock(.social), logger: logger)
                cores.social = core
                try await serve(.social, core.services)
                outbox(core.database, .rpc(peers: p, timeout: options.outboxTimeout))
                jobs.append { await core.push() }
            }
            if options.services.contains(.finance) {
                var c = FinanceConfiguration(dataDirectory: directory.path + "/finance")
                c.membershipTimeout = .milliseconds(800)
                options.finance(&c)
                let p = peers()
                let core = try FinanceCore(configuration: c, peers: p, clock: clock(.finance), logger: logger)
                cores.finance = core
                try await serve(.finance, core.services)
                outbox(core.database, .rpc(peers: p, timeout: options.outboxTimeout))
            }
            if options.services.contains(.tasks) {
                var c = TasksConfiguration(dataDirectory: directory.path + "/tasks")
                c.peerDeadline = .milliseconds(1500)
                options.tasks(&c)
                let p = peers()
                let core = try TasksCore(configuration: c, peers: p, clock: clock(.tasks), logger: logger)
                cores.tasks = core
                try await serve(.tasks, core.services, maxRequest: c.maxRequestBytes)
                outbox(core.database, .rpc(peers: p, timeout: options.outboxTimeout))
            }
        } catch {
            for s in servers.values { await s.stop() }
            for p in proxies.values { await p.close() }
            for p in peerClients { await p.close() }
            cores.social?.close()
            cores.finance?.close()
            cores.tasks?.close()
            accountsCore?.close()
            directory.remove()
            throw error
        }
        let all = jobs
        let task = Task {
            await withTaskGroup(of: Void.self) { group in
                for job in all { group.addTask { await job() } }
            }
        }
        return ServiceCluster(
            directory: directory, options: options, accountsCore: accountsCore!, socialCore: cores.social,
            financeCore: cores.finance, tasksCore: cores.tasks, servers: servers, gates: gates, proxies: proxies,
            peerClients: peerClients, nowhere: nowhere, jobs: task)
    }

    /// Stops every service (background jobs and outboxes first) and removes the data.
    public func stop() async {
        guard
            stopped.withLock({ s in
                defer { s = true }; return !s
            })
        else { return }
        socialCore?.shutDownStreams()
        jobs.cancel()
        _ = await jobs.value
        for s in ClusterService.allCases.reversed() { await servers[s]?.stop() }
        for p in proxies.values { await p.close() }
        for p in peerClients + extraPeers.withLock({ $0 }) { await p.close() }
        socialCore?.close()
        financeCore?.close()
        tasksCore?.close()
        accountsCore.close()
        nowhere.close()
        directory.remove()
    }

    // MARK: Reaching the services

    /// The server of a running service.
    public func server(_ s: ClusterService) -> TestServer {
        guard let server = servers[s] else { fatalError("\(s) is not running in this cluster") }
        return server
    }
    /// The port a service listens on.
    public func port(_ s: ClusterService) -> Int { server(s).port }
    /// The port its peers reach it at (its proxy's when proxied). A process started by a test
    /// gets this in `<PEER>_ADDR`.
    public func peerPort(_ s: ClusterService) -> Int { proxies[s]?.port ?? port(s) }
    /// The same, or a port where nothing answers for a service this cluster does not run (or
    /// keeps unreachable).
    public func peerPortOrNowhere(_ s: ClusterService) -> Int {
        servers[s] == nil || options.unreachable.contains(s) ? nowhere.port : peerPort(s)
    }

    /// New peer clients over the cluster (as a service started by the test would have them);
    /// closed by `stop()`.
    public func makePeers() -> PeerClients {
        let p = PeerClients(serviceToken: TestCredentials.serviceToken) { [self] name in
            let s = ClusterService(rawValue: name)
            var c = ChannelConfiguration(host: "127.0.0.1", port: s.map { self.peerPortOrNowhere($0) } ?? self.nowhere.port)
            c.connectTimeout = .seconds(1)
            c.maxBackoff = .milliseconds(200)
            return c
        }
        extraPeers.withLock { $0.append(p) }
        return p
    }

    /// While down, the service refuses every call with UNAVAILABLE, as a process that is
    /// restarting does (its peers' calls and the test's own).
    public func setDown(_ s: ClusterService, _ down: Bool) { gates[s]?.down.store(down, ordering: .releasing) }

    /// Bytes between a proxied service and its peers wait this long each way.
    public func setDelay(_ s: ClusterService, _ d: Duration) {
        guard let proxy = proxies[s] else { fatalError("\(s) is not proxied: add it to ClusterOptions.proxied") }
        proxy.setDelay(d)
    }

    public var accounts: Accounts_V1_AccountsClient { Accounts_V1_AccountsClient(server(.accounts).anonymous) }
    public var accountsInternal: Accounts_V1_AccountsInternalClient { Accounts_V1_AccountsInternalClient(server(.accounts).service) }
    /// social's public API as the gateway relays it (callers add their token).
    public var social: Social_V1_SocialClient { Social_V1_SocialClient(server(.social).gateway) }
    public var socialInternal: Social_V1_SocialInternalClient { Social_V1_SocialInternalClient(server(.social).service) }
    public var finance: Finance_V1_FinanceClient { Finance_V1_FinanceClient(server(.finance).anonymous) }
    public var financeInternal: Finance_V1_FinanceInternalClient { Finance_V1_FinanceInternalClient(server(.finance).service) }
    public var tasks: Tasks_V1_TasksClient { Tasks_V1_TasksClient(server(.tasks).anonymous) }
    public var tasksInternal: Tasks_V1_TasksInternalClient { Tasks_V1_TasksInternalClient(server(.tasks).service) }
}

/// Runs `body` against a fresh cluster and always stops it.
public func withCluster(_ options: ClusterOptions, _ body: (ServiceCluster) async throws -> Void) async throws {
    let cluster = try await ServiceCluster.start(options)
    do { try await body(cluster) } catch {
        await cluster.stop()
        throw error
    }
    await cluster.stop()
}

/// Peer name → port, filled as the services start (peer clients connect on first use); a peer
/// that is not running resolves to a port where nothing answers.
final class PortTable: Sendable {
    private let ports = Mutex<[String: Int]>([:])
    private let nowhere: Int
    init(nowhere: Int) { self.nowhere = nowhere }
    func set(_ name: String, _ port: Int) { ports.withLock { $0[name] = port } }
    func port(_ name: String) -> Int { ports.withLock { $0[name] } ?? nowhere }
}

/// Refuses every call with UNAVAILABLE while `down` (ahead of the access policy).
final class Gate: CallCheck {
    let down = Atomic<Bool>(false)
    func check(_ context: ServerContext) async throws {
        if down.load(ordering: .acquiring) { throw RPCError(.unavailable, "the service is restarting") }
    }
}

/// A loopback port bound but never listening, held until `close()`: a connection to it is
/// refused, and no other socket can take the port meanwhile.
public final class ClosedPort: Sendable {
    /// One held for the whole test process: a peer that is down, for tests that need a port only
    /// (a port found by binding and closing again can be taken by another test's server).
    public static let process: Int = (try? ClosedPort())?.port ?? 9

    public let port: Int
    private let fd: Int32
    public init() throws {
        do { (fd, port) = try loopbackSocket() } catch { throw RPCError(.internal, "cannot reserve a loopback port") }
    }
    public func close() { Glibc.close(fd) }
}
