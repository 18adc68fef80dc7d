import Contracts
import Foundation
import Logging
import RPCCore
import Security
import ServiceKit
import Storage

/// The state both finance services share: the database (with the kit's error mapping), the
/// clock, page tokens and the peers. `FinanceService` and `FinanceInternalService` are thin
/// wrappers around it.
public final class FinanceCore: Sendable {
    public let configuration: FinanceConfiguration
    public let database: Database
    let store: ServiceStore
    let clock: any WallClock
    let pageTokens: PageTokens
    let peers: FinancePeers
    let logger: Logger

    /// Which unique constraint protects which request field (a race lost to a concurrent request).
    static let uniqueFields: [String: ServiceStore.UniqueField] = [
        "ledger_transactions.task_id": .init(field: "task_id", message: "was settled already"),
        "ledger_transactions_task": .init(field: "task_id", message: "was settled already"),
    ]

    /// Opens (and migrates) the database. Blocking: call at startup.
    public init(
        configuration: FinanceConfiguration, peers: PeerClients, clock: any WallClock = SystemClock(),
        logger: Logger = Logger(label: "finance")
    ) throws {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        let opened = try ServiceStore.open(
            directory: configuration.dataDirectory, schema: FinanceSchema.schema,
            uniqueFields: Self.uniqueFields, logger: logger)
        (database, store, pageTokens) = (opened.database, opened.store, opened.pageTokens)
        self.peers = FinancePeers(peers: peers, configuration: configuration, logger: logger)
    }

    /// The public service.
    public var service: FinanceService { FinanceService(core: self) }
    /// The service-to-service API.
    public var internalService: FinanceInternalService { FinanceInternalService(core: self) }
    /// Both, for a server's service list.
    public var services: [any RPCService] { [service, internalService] }

    /// Loops next to the server (the outbox is delivered by the host): daily upkeep.
    public var backgroundJobs: [@Sendable () async -> Void] { [{ await self.maintenance() }] }

    public func close() { database.close() }

    /// Verifies every ledger of the database (the operator's `--verify-ledgers`): one line per
    /// scope; true when all verify.
    public func verifyAll() throws -> (ok: Bool, report: [String]) {
        try database.readSync { c in
            var ok = true
            var lines: [String] = []
            for scope in try Ledger.scopes(c) {
                let v = try Ledger.verify(c, scope: scope)
                ok = ok && v.verified
                let name = scope.isEmpty ? "marketplace" : "household \(scope)"
                lines.append(
                    v.verified
                        ? "\(name): verified, \(v.entriesChecked) entries, head \(v.headHash)"
                        : "\(name): NOT verified after \(v.entriesChecked) entries: "
                            + (v.firstBadTransactionId.isEmpty ? "" : "entry #\(v.firstBadSequence) (\(v.firstBadTransactionId)): ") + v.problem)
            }
            return (ok, lines)
        }
    }

    /// Daily: kit tables past their keeping time; undelivered notifications said in the log.
    func maintenance() async {
        while !Task.isCancelled {
            do {
                // Idempotency keys are kept for ever: a money request retried months later (an
                // offline phone's queue) must find its key, never record twice.
                try await store.purgeKitTables(now: clock.nowMilliseconds(), keepIdempotencyKeys: nil)
                let pending = try await database.pendingOutbox(limit: 1000)
                if let oldest = pending.first {
                    logger.warning("notifications waiting for social", metadata: ["pending": "\(pending.count)", "oldest": "\(oldest.createdAt)"])
                }
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(24 * 3600))
        }
    }

    /// The verified caller of an authenticated RPC.
    func caller(_ context: ServerContext) throws -> String { try context.requireIdentity().userID }

    /// Users erased here (shown as "Deleted user").
    func erased(among ids: [String]) async throws -> Set<String> {
        guard !ids.isEmpty else { return [] }
        let unique = Array(Set(ids))
        return try await store.read { c in
            var out = Set<String>()
            for id in unique where try c.queryOne("SELECT 1 FROM erased_users WHERE user_id = ?", id) != nil { out.insert(id) }
            return out
        }
    }

    /// UserRefs for `ids`, names from accounts (degraded to ids while it is down).
    func refs(_ ids: [String]) async throws -> [String: Common_V1_UserRef] {
        await peers.userRefs(ids, erased: try await erased(among: ids))
    }
}
